"""POST/GET /v1/jobs against a real nats-server; the scheduler's part is played by the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import httpx
import nats
import pytest

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import (
    Cancelled,
    CancelRequest,
    Failed,
    JobEvent,
    Progress,
    Queued,
    Succeeded,
)
from swarm_contracts.jobs import AdapterRef, JobRecord, JobSpec, JobState, JobSubmission
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

DATA = "".join(json.dumps({"text": f"example {i}"}) + "\n" for i in range(4)).encode()


async def dataset(client: httpx.AsyncClient) -> str:
    resp = await client.post("/v1/datasets", files={"file": ("d.jsonl", DATA)})
    assert resp.status_code in (200, 201), resp.text
    return resp.json()["id"]


def spec(ds: str, **extra: object) -> dict:
    body: dict = {"name": "bot", "base_model": "tiny-llama", "dataset": ds}
    body.update(extra)
    return body


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"name": "Has Spaces"}, ["body", "name"]),
        ({"training": {"max_steps": 0}}, ["body", "training", "max_steps"]),
        ({"training": {"max_stepz": 5}}, ["body", "training", "max_stepz"]),
        ({"epochs": 3}, ["body", "epochs"]),
        ({"lora": {"r": 0}}, ["body", "lora", "r"]),
        ({"priority": 11}, ["body", "priority"]),
        ({"method": {"type": "dpo", "beta": 0}}, ["body", "method", "dpo", "beta"]),
        ({"method": {"type": "ppo"}}, ["body", "method"]),
    ],
)
async def test_spec_validation_names_the_field(
    client: httpx.AsyncClient, patch: dict, loc: list[str]
) -> None:
    ds = await dataset(client)
    resp = await client.post("/v1/jobs", json=spec(ds, **patch))
    assert resp.status_code == 422, resp.text
    assert loc in [e["loc"] for e in resp.json()["detail"]]


async def test_a_method_trains_only_on_its_own_format(client: httpx.AsyncClient) -> None:
    text = await dataset(client)
    pairs = "".join(
        json.dumps({"prompt": f"{i} + 1 =", "chosen": f" {i + 1}", "rejected": f" {i}"}) + "\n"
        for i in range(4)
    )
    resp = await client.post("/v1/datasets", files={"file": ("p.jsonl", pairs.encode())})
    assert resp.json()["format"] == "preference"
    preference = resp.json()["id"]
    dpo = {"method": {"type": "dpo"}}
    refused = await client.post("/v1/jobs", json=spec(text, **dpo))
    assert refused.status_code == 422
    detail = refused.json()["detail"][0]
    assert detail["loc"] == ["body", "dataset"]
    assert "holds text examples: a DPO job needs preference pairs" in detail["msg"]
    refused = await client.post("/v1/jobs", json=spec(preference, validation=text, **dpo))
    assert refused.json()["detail"][0]["loc"] == ["body", "validation"]
    refused = await client.post("/v1/jobs", json=spec(preference))
    assert refused.status_code == 422
    assert "method {'type': 'dpo'}" in refused.json()["detail"][0]["msg"]
    accepted = await client.post("/v1/jobs", json=spec(preference, **dpo))
    assert accepted.status_code in (201, 202), accepted.text
    assert accepted.json()["spec"]["method"] == {"type": "dpo", "beta": 0.1}


async def test_unknown_datasets_are_named(client: httpx.AsyncClient) -> None:
    ds = await dataset(client)
    resp = await client.post("/v1/jobs", json=spec("ds-" + "0" * 24))
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "dataset"]
    resp = await client.post("/v1/jobs", json=spec(ds, validation="ds-" + "1" * 24))
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "validation"]


async def test_idempotent_submit_publishes_once(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    subjects = Subjects(settings.namespace)
    ds = await dataset(client)
    headers = {"Idempotency-Key": "same-key"}
    first = await client.post("/v1/jobs", json=spec(ds), headers=headers)
    second = await client.post("/v1/jobs", json=spec(ds), headers=headers)
    # No scheduler here: both are accepted, with one job id.
    assert first.status_code == second.status_code == 202, first.text
    assert first.json()["job_id"] == second.json()["job_id"]
    assert first.json()["state"] == "queued"

    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.submit_stream)
        assert info.state.messages == 1
        msg = await js.get_msg(subjects.submit_stream, seq=1)
        assert msg.headers
        assert msg.headers["Nats-Msg-Id"] == first.json()["job_id"]
        event = CloudEvent[JobSubmission].model_validate_json(msg.data)
        assert event.type == "swarm.job.submit"
        assert event.source == "swarm/gateway"
        assert event.data.job_id == first.json()["job_id"]
        assert event.data.tenant == "default"

        other = await client.post("/v1/jobs", json=spec(ds), headers={"Idempotency-Key": "k2"})
        assert other.json()["job_id"] != first.json()["job_id"]
        assert (await js.stream_info(subjects.submit_stream)).state.messages == 2
    finally:
        await nc.close()


async def fake_scheduler(settings: Settings) -> tuple[nats.NATS, RecordTable[JobRecord]]:
    """Creates records from submissions, as the scheduler would."""
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)

    async def on_submit(msg: nats.aio.msg.Msg) -> None:
        sub = CloudEvent[JobSubmission].model_validate_json(msg.data).data
        assert sub.job_id
        await jobs.create(
            sub.job_id, JobRecord(job_id=sub.job_id, tenant=sub.tenant, spec=sub.spec)
        )
        await msg.ack()

    await js.subscribe(subjects.submit, cb=on_submit, stream=subjects.submit_stream)
    return nc, jobs


Report = Callable[[JobEvent], Awaitable[None]]
FINAL_STATES = {
    Succeeded: JobState.succeeded,
    Failed: JobState.failed,
    Cancelled: JobState.cancelled,
}


@contextlib.asynccontextmanager
async def reporting(
    settings: Settings, gateway_url: str
) -> AsyncIterator[tuple[RecordTable[JobRecord], Report, httpx.AsyncClient]]:
    """A fake scheduler (``fake_scheduler``), a way to report job events as a worker does, and
    an HTTP client of the gateway. A final event of the record's attempt then ends the record,
    as the scheduler's next step would: the gateway ends a job's stream once the record shows
    the end, waiting for it for up to ``SETTLE_S`` otherwise."""
    nc, jobs = await fake_scheduler(settings)
    broker = make_broker(settings, "test")
    await broker.start()
    subjects = Subjects(settings.namespace)

    async def report(event: JobEvent) -> None:
        await publish_job_event(broker, subjects, "test", event)
        state = FINAL_STATES.get(type(event))
        if state is None:
            return

        def end(record: JobRecord) -> JobRecord:
            if record.attempt == event.attempt:
                record.state = state
            return record

        await jobs.modify(event.job_id, end)

    try:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as client:
            yield jobs, report, client
    finally:
        await broker.stop()
        await nc.close()


async def test_submit_get_list_cancel(client: httpx.AsyncClient, settings: Settings) -> None:
    nc, jobs = await fake_scheduler(settings)
    try:
        ds = await dataset(client)
        created = await client.post("/v1/jobs", json=spec(ds), headers={"Idempotency-Key": "a"})
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        again = await client.post("/v1/jobs", json=spec(ds), headers={"Idempotency-Key": "a"})
        assert again.status_code == 200
        assert again.json()["job_id"] == job_id

        assert (await client.get(f"/v1/jobs/{job_id}")).json()["job_id"] == job_id
        assert (await client.get("/v1/jobs/job-0000000000")).status_code == 404

        # A few more jobs, one renamed, one finished, for filters and pagination.
        for i in range(3):
            body = spec(ds, name="other" if i == 0 else "bot")
            resp = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"k{i}"})
            assert resp.status_code == 201
        last = resp.json()["job_id"]

        def finish(r: JobRecord) -> JobRecord:
            r.state = JobState.succeeded
            r.created_at = r.created_at + timedelta(seconds=5)
            return r

        await jobs.modify(last, finish)
        page1 = (await client.get("/v1/jobs", params={"limit": 2})).json()
        assert len(page1["data"]) == 2
        assert page1["next_cursor"]
        assert page1["data"][0]["job_id"] == last  # newest first
        page2 = (
            await client.get("/v1/jobs", params={"limit": 2, "cursor": page1["next_cursor"]})
        ).json()
        assert len(page2["data"]) == 2
        assert page2["next_cursor"] is None
        ids = [j["job_id"] for j in page1["data"] + page2["data"]]
        assert len(set(ids)) == 4
        done = (await client.get("/v1/jobs", params={"state": "succeeded"})).json()["data"]
        assert [j["job_id"] for j in done] == [last]
        named = (await client.get("/v1/jobs", params={"name": "other"})).json()["data"]
        assert len(named) == 1
        assert named[0]["spec"]["name"] == "other"

        cancel = await client.post(f"/v1/jobs/{job_id}/cancel")
        assert cancel.status_code == 202
        assert cancel.json()["job_id"] == job_id
        js = nc.jetstream()
        subjects = Subjects(settings.namespace)
        msg = await js.get_last_msg(subjects.control_stream, subjects.cancel(job_id))
        event = CloudEvent[CancelRequest].model_validate_json(msg.data)
        assert event.type == "swarm.job.cancel"
        assert event.data.job_id == job_id
    finally:
        await nc.close()


async def test_metrics_needs_telemetry(client: httpx.AsyncClient, settings: Settings) -> None:
    nc, _ = await fake_scheduler(settings)
    try:
        ds = await dataset(client)
        job_id = (await client.post("/v1/jobs", json=spec(ds))).json()["job_id"]
        resp = await client.get(f"/v1/jobs/{job_id}/metrics")
        assert resp.status_code == 503
        assert "telemetry" in resp.json()["detail"]
    finally:
        await nc.close()


async def test_events_stream_replays_and_follows(live_gateway, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    async with reporting(settings, live_gateway.url) as (_, report, c):
        ds = await dataset(c)
        record = (await c.post("/v1/jobs", json=spec(ds))).json()
        job_id = record["job_id"]
        job_spec = JobSpec.model_validate(record["spec"])
        await report(Queued(job_id=job_id, tenant="default", spec=job_spec))

        async def later() -> None:
            await asyncio.sleep(0.3)
            for step in (1, 2):
                await report(
                    Progress(
                        job_id=job_id,
                        step=step,
                        max_steps=2,
                        loss=1.0,
                        lr=1e-4,
                        tokens_per_s=10.0,
                    ),
                )
            adapter = AdapterRef(name="bot", version=1, store_key="adapters/default/bot/1")
            await report(Succeeded(job_id=job_id, adapter=adapter))

        task = asyncio.create_task(later())
        events: list[tuple[str, str, dict]] = []
        async with c.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            assert resp.status_code == 200
            events = await read_sse(resp)
        await task
        assert [e[0] for e in events] == ["queued", "progress", "progress", "succeeded"]
        assert events[1][2]["data"]["step"] == 1
        assert events[3][2]["type"] == "swarm.job.succeeded"

        # Resume after the first progress event: only what follows is replayed.
        headers = {"Last-Event-ID": events[1][1]}
        async with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
            resumed = await read_sse(resp)
        assert [e[0] for e in resumed] == ["progress", "succeeded"]


async def read_sse(resp: httpx.Response) -> list[tuple[str, str, dict]]:
    events: list[tuple[str, str, dict]] = []
    name = ident = ""
    data: list[str] = []
    async for line in resp.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            events.append((name, ident, json.loads("\n".join(data))))
            name, ident, data = "", "", []
    return events


async def test_healthz_and_prometheus(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok", "nats": True}
    await client.get("/v1/workers")
    text = (await client.get("/metrics")).text
    assert "swarm_gateway_requests_total" in text
    assert 'route="/v1/workers"' in text


async def test_workers_empty(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/workers")).json() == {"data": []}


async def read_sse_until(resp: httpx.Response, n: int) -> list[tuple[str, str, dict]]:
    """At most ``n`` events, then stop reading (the caller closes the connection)."""
    events: list[tuple[str, str, dict]] = []
    name = ident = ""
    data: list[str] = []
    async for line in resp.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            events.append((name, ident, json.loads("\n".join(data))))
            name, ident, data = "", "", []
            if len(events) >= n:
                break
    return events

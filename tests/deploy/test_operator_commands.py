"""The operators' commands on a stack secured by the shipped deploy/nats/nats-auth.conf: each
service as its own NATS user (registry, scheduler, gateway in-process; the trainers played by
the test as the trainer user, through the wire contract).

``swarm workers cordon|drain|uncordon|clear`` and ``swarm jobs verify`` are the gateway's
``/v1/workers/{id}/...`` and ``/v1/jobs/{id}/verify``; the gateway writes the ``worker_ops``
bucket and publishes the verify request, and the scheduler marks a worker a verification
caught suspect in the same bucket. All of it must work under the shipped permissions, with no
permissions violation in the server's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from faststream.nats import NatsBroker

from swarm_contracts.envelope import envelope
from swarm_contracts.events import CheckpointSaved, JobEvent, Replayed, Started, Succeeded
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import ReplayReport
from swarm_contracts.workers import Heartbeat, Resources
from swarm_gateway import create_app
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.topology import kv_bucket

from ..scheduler.conftest import wait_record, write_fake_model
from .test_nats_permissions import as_service, connect, run_nats, shipped_config

SUBJECTS = Subjects()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A nats-server with the shipped auth config (as shipped): its URL and its log file."""
    conf = shipped_config(tmp_path)
    for url in run_nats(conf):
        yield url, conf.with_suffix(".log")


class Trainers:
    """Trainer agents played as the ``trainer`` NATS user: heartbeats, their assignments,
    their job events with the assignment's attempt token."""

    def __init__(self, nc: nats.NATS, broker: NatsBroker) -> None:
        self.nc, self.broker = nc, broker
        self.beating: dict[str, asyncio.Task[None]] = {}

    def beat(self, worker_id: str) -> None:
        async def loop() -> None:
            res = Resources(cpus=2, memory_bytes=1 << 30)
            while True:
                hb = Heartbeat(worker_id=worker_id, resources=res, free=res)
                event = envelope("trainer", "swarm.worker.heartbeat", hb)
                await self.nc.publish(
                    SUBJECTS.heartbeat(worker_id), event.model_dump_json().encode()
                )
                await asyncio.sleep(0.3)

        self.beating[worker_id] = asyncio.create_task(loop())

    async def stop(self) -> None:
        for task in self.beating.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def assignment(self, worker_id: str, job_id: str) -> dict[str, Any]:
        sub = await self.nc.jetstream().subscribe(SUBJECTS.assign(worker_id), ordered_consumer=True)
        try:
            for _ in range(100):
                data = json.loads((await sub.next_msg(timeout=10)).data)["data"]
                if data["job_id"] == job_id:
                    return data
        finally:
            await sub.unsubscribe()
        raise AssertionError(f"no assignment of {job_id} for {worker_id}")

    async def emit(self, event: JobEvent, token: str, worker_id: str) -> None:
        """On the worker's own subject, as an agent does: the scheduler republishes it."""
        await publish_job_event(
            self.broker, SUBJECTS, "trainer", event, attempt_token=token, worker_id=worker_id
        )


@contextlib.asynccontextmanager
async def trainers(url: str, tmp_path: Path) -> AsyncIterator[Trainers]:
    nc, errors = await connect(url, "trainer")
    broker = make_broker(as_service(url, "trainer", tmp_path), "trainer")
    await broker.connect()
    played = Trainers(nc, broker)
    try:
        yield played
    finally:
        await played.stop()
        await broker.stop()
        await nc.close()
    assert not errors


async def workers(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    listed = await c.get("/v1/workers")
    assert listed.status_code == 200, listed.text
    return {w["worker_id"]: w for w in listed.json()["data"]}


async def until(c: httpx.AsyncClient, check: Any, what: str) -> dict[str, dict[str, Any]]:
    for _ in range(100):
        table = await workers(c)
        if check(table):
            return table
        await asyncio.sleep(0.1)
    raise AssertionError(f"the worker table never showed {what}: {table}")


async def test_operator_commands_work_under_the_shipped_permissions(
    secured: tuple[str, Path], tmp_path: Path
) -> None:
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_scheduler.settings import SchedulerSettings

    url, nats_log = secured
    scheduler_settings = SchedulerSettings.of(
        as_service(url, "scheduler", tmp_path), worker_timeout_s=30.0
    )
    app = create_app(as_service(url, "gateway", tmp_path), submit_wait_s=5.0, request_timeout_s=5.0)
    async with (
        build_registry(as_service(url, "registry", tmp_path)),
        build_scheduler(scheduler_settings),
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
        trainers(url, tmp_path) as played,
    ):
        write_fake_model(tmp_path / "model")
        files = [("files", (p.name, p.read_bytes())) for p in (tmp_path / "model").iterdir()]
        assert (await c.post("/v1/models", data={"name": "tiny"}, files=files)).status_code == 201
        data = "".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)).encode()
        ds = (await c.post("/v1/datasets", files={"file": ("d.jsonl", data)})).json()["id"]

        # A job trained by w1, with two committed checkpoints: one that can be verified.
        played.beat("w1")
        await until(c, lambda t: "w1" in t, "w1")
        spec = {
            "name": "bot",
            "base_model": "tiny",
            "dataset": ds,
            "training": {"max_steps": 6, "checkpoint_every": 2},
        }
        job = await c.post("/v1/jobs", json=spec)
        assert job.status_code == 201, job.text
        job_id = job.json()["job_id"]
        given = await played.assignment("w1", job_id)
        token = given["attempt_token"]
        await played.emit(Started(job_id=job_id, attempt=1, worker_id="w1"), token, "w1")
        for step in (4, 6):
            saved = CheckpointSaved(job_id=job_id, attempt=1, step=step, store_key="k")
            await played.emit(saved, token, "w1")
        adapter = AdapterRef(name="bot", version=1, store_key="adapters/default/bot/1")
        done = Succeeded(job_id=job_id, attempt=1, adapter=adapter, checkpoints=[4, 6])
        await played.emit(done, token, "w1")
        jobs_nc = await nats.connect(
            url,
            user="gateway",
            password="pw-gateway-0123",
            inbox_prefix=Subjects.service_inbox("gateway"),
        )
        jobs = RecordTable(await kv_bucket(jobs_nc.jetstream(), SUBJECTS, "jobs"), JobRecord)
        await wait_record(jobs, job_id, lambda r: r.state == JobState.succeeded)
        for _ in range(100):  # and the gateway's copy of the record shows it
            shown = (await c.get(f"/v1/jobs/{job_id}")).json()
            if shown["state"] == "succeeded" and len(shown["checkpoints"]) == 2:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the gateway never showed {job_id} verifiable: {shown}")

        # Cordon, uncordon, drain, uncordon a second worker.
        played.beat("w2")
        await until(c, lambda t: "w2" in t, "w2")
        cordoned = await c.post("/v1/workers/w2/cordon", json={"reason": "maintenance"})
        assert cordoned.status_code == 200, cordoned.text
        await until(c, lambda t: t["w2"]["cordoned"], "w2 cordoned")
        assert (await c.post("/v1/workers/w2/uncordon")).status_code == 200
        await until(c, lambda t: not t["w2"]["cordoned"], "w2 uncordoned")
        drained = await c.post("/v1/workers/w2/drain", json={"move_jobs": True})
        assert drained.status_code == 200, drained.text
        await until(c, lambda t: t["w2"]["draining"], "w2 draining")
        assert (await c.post("/v1/workers/w2/uncordon")).status_code == 200
        await until(c, lambda t: not t["w2"]["draining"], "w2 no longer draining")

        # Verify: replayed on w2, which finds w1's weights far off: the scheduler marks w1
        # suspect (in worker_ops) until an operator clears it.
        verify = await c.post(f"/v1/jobs/{job_id}/verify")
        assert verify.status_code == 202, verify.text
        record = await wait_record(jobs, job_id, lambda r: r.verification is not None)
        assert record.verification is not None
        replay_id = record.verification.replay_job_id
        replay = await played.assignment("w2", replay_id)
        await played.emit(
            Started(job_id=replay_id, attempt=1, worker_id="w2"), replay["attempt_token"], "w2"
        )
        report = ReplayReport(
            from_step=4, to_step=6, distances={"q.lora_B": 0.9}, losses={5: 1.0, 6: 1.0}
        )
        replayed = Replayed(job_id=replay_id, attempt=1, worker_id="w2", report=report)
        await played.emit(replayed, replay["attempt_token"], "w2")
        settled = await wait_record(
            jobs, job_id, lambda r: r.verification and r.verification.outcome != "pending"
        )
        assert settled.verification is not None
        assert settled.verification.outcome == "failed", settled.verification
        await until(c, lambda t: t["w1"]["suspect"], "w1 suspect")
        cleared = await c.post("/v1/workers/w1/clear")
        assert cleared.status_code == 200, cleared.text
        await until(c, lambda t: not t["w1"]["suspect"], "w1 cleared")
        await jobs_nc.close()

    violations = [
        line
        for line in nats_log.read_text().splitlines()
        if "permissions violation" in line.lower()
    ]
    assert violations == []

"""Telemetry against the real events stream: NATS queries, HTTP, Prometheus, restarts."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from swarm_contracts.events import (
    Assigned,
    Failed,
    JobEvent,
    Progress,
    Queued,
    Released,
    Replayed,
    Started,
    Validated,
)
from swarm_contracts.jobs import JobSpec
from swarm_contracts.metrics import TrainPoint
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import ReplayReport
from swarm_runtime.settings import Settings
from swarm_telemetry import TelemetryService, build_app
from swarm_telemetry.series import SeriesStore, downsample
from swarm_telemetry.settings import TelemetrySettings

Publish = Callable[[JobEvent], Awaitable[None]]


def progress(job_id: str, step: int, attempt: int = 1) -> Progress:
    return Progress(
        job_id=job_id,
        attempt=attempt,
        step=step,
        max_steps=100,
        loss=4.0 / step,
        lr=1e-4,
        tokens_per_s=1000.0 + step,
    )


async def query(nc: Client, settings: Settings, body: dict[str, Any]) -> dict[str, Any]:
    subject = Subjects(settings.namespace).telemetry("metrics.get")
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=5)
    return json.loads(msg.data)


async def wait_for_points(
    nc: Client, settings: Settings, job_id: str, n: int, evals: int = 0
) -> dict[str, Any]:
    """Events arrive asynchronously: poll until the series has ``n`` training points and
    ``evals`` evaluation points."""
    reply: dict[str, Any] = {}
    for _ in range(100):
        try:
            reply = await query(nc, settings, {"job_id": job_id})
        except nats.errors.NoRespondersError:
            # Under load the service's request subscription can lag its start by a moment.
            await asyncio.sleep(0.05)
            continue
        if (
            reply["ok"]
            and len(reply["result"]["train"]) >= n
            and len(reply["result"]["eval"]) >= evals
        ):
            return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"series for {job_id} never reached {n} points: {reply}")


async def start(settings: Settings) -> TelemetryService:
    service = build_app(settings)
    await service.app.start()
    return service


async def test_series_over_nats_http_and_prometheus(settings: Settings, publish: Publish) -> None:
    # Half the events before the service starts (replayed), half after (live).
    spec = JobSpec(name="bot", base_model="tiny", dataset="ds-" + "a" * 24)
    await publish(Queued(job_id="job-a", tenant="acme", spec=spec))
    await publish(Assigned(job_id="job-a", attempt=1, worker_id="w1"))
    await publish(Started(job_id="job-a", attempt=1, worker_id="w1"))
    for step in range(1, 6):
        await publish(progress("job-a", step))
    service = await start(settings)
    nc = await nats.connect(settings.nats_url)
    try:
        for step in range(6, 11):
            await publish(progress("job-a", step))
        await publish(Validated(job_id="job-a", attempt=1, step=5, eval_loss=1.2, perplexity=3.3))
        await publish(Validated(job_id="job-a", attempt=1, step=10, eval_loss=1.0, perplexity=2.7))
        await publish(Failed(job_id="job-b", reason="unknown base model"))
        # A redelivered or re-published event must not duplicate a point.
        await publish(progress("job-a", 10))

        reply = await wait_for_points(nc, settings, "job-a", 10)
        train = [TrainPoint.model_validate(p) for p in reply["result"]["train"]]
        assert [p.step for p in train] == list(range(1, 11))
        assert train[0] == TrainPoint(step=1, loss=4.0, lr=1e-4, tokens_per_s=1001.0, attempt=1)
        for _ in range(100):
            reply = await query(nc, settings, {"job_id": "job-a"})
            if len(reply["result"]["eval"]) == 2:
                break
            await asyncio.sleep(0.05)
        assert [p["eval_loss"] for p in reply["result"]["eval"]] == [1.2, 1.0]

        small = await query(nc, settings, {"job_id": "job-a", "max_points": 3})
        assert [p["step"] for p in small["result"]["train"]] == [1, 6, 10]
        unknown = await query(nc, settings, {"job_id": "job-zzz"})
        assert unknown == {
            "ok": False,
            "error": "unknown job 'job-zzz'",
            "code": "not_found",
            "result": None,
        }

        transport = httpx.ASGITransport(app=service.http)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            got = await http.get("/v1/jobs/job-a/metrics", params={"max_points": 4})
            assert got.status_code == 200
            assert [p["step"] for p in got.json()["train"]] == [1, 4, 7, 10]
            full = await http.get("/v1/jobs/job-a/metrics")
            assert len(full.json()["train"]) == 10
            assert (await http.get("/v1/jobs/nope/metrics")).status_code == 404
            assert (await http.get("/v1/jobs/job-a/metrics?max_points=1")).status_code == 422
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            text = (await http.get("/metrics")).text
        assert 'swarm_telemetry_events_total{event="progress"} 11.0' in text
        assert 'swarm_telemetry_events_total{event="failed"} 1.0' in text
        assert 'swarm_telemetry_jobs{state="running"} 1.0' in text
        assert 'swarm_telemetry_jobs{state="failed"} 1.0' in text
        assert "swarm_training_tokens_per_second 1010.0" in text
        assert "swarm_training_step_loss_count 11.0" in text
        assert "job-a" not in text  # job ids are not labels
    finally:
        await nc.close()
        await service.app.stop()


async def test_restart_rebuilds_series_from_the_stream(
    settings: Settings, publish: Publish
) -> None:
    for step in range(1, 8):
        await publish(progress("job-r", step))
    await publish(Validated(job_id="job-r", attempt=1, step=7, eval_loss=0.9, perplexity=2.5))
    nc = await nats.connect(settings.nats_url)
    try:
        first = await start(settings)
        # The validation follows the progress events: wait for it too, or a loaded
        # machine stops the first service before it has read it.
        before = await wait_for_points(nc, settings, "job-r", 7, evals=1)
        await first.app.stop()

        # A requeued job's second attempt, published while telemetry is down.
        await publish(progress("job-r", 5, attempt=2))
        second = await start(settings)
        try:
            after = await wait_for_points(nc, settings, "job-r", 8, evals=1)
        finally:
            await second.app.stop()
    finally:
        await nc.close()
    assert after["result"]["train"][:7] == before["result"]["train"]
    assert after["result"]["train"][7] | {} == {
        "step": 5,
        "loss": 0.8,
        "lr": 1e-4,
        "tokens_per_s": 1005.0,
        "attempt": 2,
    }
    assert after["result"]["eval"] == before["result"]["eval"]


async def test_invalid_events_are_skipped(settings: Settings, publish: Publish) -> None:
    nc = await nats.connect(settings.nats_url)
    subjects = Subjects(settings.namespace)
    try:
        await nc.jetstream().publish(subjects.job_event("job-x", "progress"), b"not json")
        await nc.jetstream().publish(
            subjects.job_event("job-x", "progress"), json.dumps({"data": {"step": 1}}).encode()
        )
        await publish(progress("job-x", 1))
        service = await start(settings)
        try:
            await wait_for_points(nc, settings, "job-x", 1)
            text = (
                await httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=service.http), base_url="http://t"
                ).get("/metrics")
            ).text
            assert "swarm_telemetry_invalid_events_total 2.0" in text
        finally:
            await service.app.stop()
    finally:
        await nc.close()


async def test_run_serves_http_on_the_configured_port(settings: Settings, publish: Publish) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = TelemetrySettings.of(settings, telemetry_port=port, otel_exporter="console")
    await publish(progress("job-h", 1))
    service = build_app(settings)
    task = asyncio.create_task(service.run())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(100):
                try:
                    got = await http.get("/v1/jobs/job-h/metrics")
                    if got.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            assert got.status_code == 200
            assert got.json()["train"][0]["step"] == 1
    finally:
        service.exit()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 101, 1000])
@pytest.mark.parametrize("m", [2, 3, 7, 100])
def test_downsample_keeps_first_last_and_bound(n: int, m: int) -> None:
    points = list(range(n))
    picked = downsample(points, m)
    assert len(picked) == min(n, m)
    assert picked == sorted(set(picked))
    if n:
        assert picked[0] == 0
        assert picked[-1] == n - 1
    assert downsample(points, None) == points


def test_a_replay_job_ends_succeeded_in_the_jobs_by_state_count() -> None:
    # A replay job ends with `replayed`, never `succeeded`: it must not stay "running".
    store = SeriesStore()
    spec = JobSpec(name="bot", base_model="tiny", dataset="ds-" + "a" * 24)
    report = ReplayReport(from_step=2, to_step=4, distances={"q": 0.0}, losses={3: 1.0, 4: 0.9})
    for event in [
        Queued(job_id="job-r", tenant="acme", spec=spec),
        Assigned(job_id="job-r", attempt=1, worker_id="w2"),
        Started(job_id="job-r", attempt=1, worker_id="w2"),
        progress("job-r", 3),
        Replayed(job_id="job-r", attempt=1, worker_id="w2", report=report),
    ]:
        store.apply(event)
    assert store.count_by_state()["succeeded"] == 1
    assert store.count_by_state()["running"] == 0
    assert store.running_tokens_per_s() == 0.0


def test_an_event_that_leaves_the_state_moves_no_count() -> None:
    store = SeriesStore()
    store.apply(Started(job_id="job-h", attempt=1, worker_id="w1"))
    store.apply(Released(job_id="job-h", attempt=1, worker_id="w1", reason="drained"))
    # Still running until the scheduler's `requeued` comes.
    counts = store.count_by_state()
    assert counts["running"] == 1
    assert sum(counts.values()) == 1

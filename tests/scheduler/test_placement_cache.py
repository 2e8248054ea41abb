"""Placement prefers a worker that holds the job's base model in its cache, after fit."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobRecord, JobState, ModelRef, job_id_for
from swarm_contracts.workers import Heartbeat, Resources, WorkerInfo
from swarm_scheduler.placement import plan
from swarm_scheduler.worker_table import WorkerTable

from .conftest import Harness
from .test_placement import job, worker

MODEL = "a" * 64
OTHER = "b" * 64


def on_model(record: JobRecord, digest: str = MODEL) -> JobRecord:
    record.base_model = ModelRef(name="tiny", version=1, store_key="models/tiny/x", digest=digest)
    return record


def holding(w: WorkerInfo, *digests: str) -> WorkerInfo:
    return w.model_copy(update={"cached_models": list(digests)})


def placed(jobs: list[JobRecord], workers: list[WorkerInfo]) -> dict[str, str]:
    return {j.job_id: w for j, w in plan(jobs, workers, jobs).placements}


def test_of_two_equal_workers_the_one_holding_the_model_wins() -> None:
    j = on_model(job("job-1", cpus=2))
    # Without the cache the smaller id wins; the holder wins whatever its id.
    assert placed([j], [worker("w-a", cpus=4), worker("w-b", cpus=4)]) == {"job-1": "w-a"}
    workers = [worker("w-a", cpus=4), holding(worker("w-b", cpus=4), OTHER, MODEL)]
    assert placed([j], workers) == {"job-1": "w-b"}
    # Holding another model is no reason.
    workers = [worker("w-a", cpus=4), holding(worker("w-b", cpus=4), OTHER)]
    assert placed([j], workers) == {"job-1": "w-a"}


def test_fit_still_wins_over_the_cache() -> None:
    j = on_model(job("job-1", cpus=2))
    tight = worker("w-tight", cpus=2)
    roomy_holder = holding(worker("w-roomy", cpus=8), MODEL)
    assert placed([j], [roomy_holder, tight]) == {"job-1": "w-tight"}
    # Once the tight one is full, the holder is the best that fits.
    second = on_model(job("job-2", cpus=2, age_s=-1))
    assert placed([j, second], [roomy_holder, tight]) == {"job-1": "w-tight", "job-2": "w-roomy"}


def test_a_holder_that_cannot_run_the_job_is_passed_over() -> None:
    j = on_model(job("job-1", cpus=2, labels={"region": "eu"}))
    workers = [
        holding(worker("w-us", cpus=4, labels={"region": "us"}), MODEL),
        worker("w-eu", cpus=4, labels={"region": "eu"}),
    ]
    assert placed([j], workers) == {"job-1": "w-eu"}


def test_a_full_holder_is_passed_over_for_a_free_equal_worker() -> None:
    first, second = on_model(job("job-1", cpus=4)), on_model(job("job-2", cpus=4, age_s=-1))
    workers = [holding(worker("w-b", cpus=4), MODEL), worker("w-a", cpus=4)]
    assert placed([first, second], workers) == {"job-1": "w-b", "job-2": "w-a"}


def heartbeat(worker_id: str, **kw: Any) -> Heartbeat:
    res = Resources(cpus=2, memory_bytes=1 << 30)
    return Heartbeat(worker_id=worker_id, resources=res, free=res, **kw)


def test_the_pool_follows_what_a_worker_says_it_holds() -> None:
    table = WorkerTable(timeout_s=10)
    table.heartbeat(heartbeat("w1"))
    assert table.pool().holders == {}
    info, _ = table.heartbeat(heartbeat("w1", cached_models=[MODEL]))
    assert info.cached_models == [MODEL]
    assert table.pool().holders == {MODEL: ["w1"]}
    table.heartbeat(heartbeat("w1", cached_models=[]))
    assert table.pool().holders == {}


async def test_the_scheduler_places_on_the_worker_whose_heartbeat_holds_the_model(
    harness: Harness,
) -> None:
    reply = await harness.nc.request(
        harness.subjects.registry("models.get"), json.dumps({"name": "tiny"}).encode(), timeout=10
    )
    digest = json.loads(reply.data)["result"]["digest"]
    beats = {"w-a": heartbeat("w-a"), "w-b": heartbeat("w-b", cached_models=[OTHER, digest])}

    async def beat() -> None:
        while True:
            for worker_id, hb in beats.items():
                event = envelope("trainer", "swarm.worker.heartbeat", hb)
                await harness.nc.publish(
                    harness.subjects.heartbeat(worker_id), event.model_dump_json().encode()
                )
            await asyncio.sleep(0.3)

    beating = asyncio.create_task(beat())
    try:
        table = harness.scheduler.workers
        for _ in range(100):
            if table.is_alive("w-a") and table.pool().holders.get(digest) == ["w-b"]:
                break
            await asyncio.sleep(0.05)
        # Two equal idle workers: without the cache the smaller id (w-a) would get the job.
        await harness.submit(harness.spec(), msg_id="k")
        job_id = job_id_for("default", "k")
        record = await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
        assert record.worker_id == "w-b"
        assert record.base_model is not None
        assert record.base_model.digest == digest
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating

"""Cordon, drain and a worker's goodbye, against a real scheduler on a real nats-server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from swarm_contracts.events import Released, Started
from swarm_contracts.jobs import JobRecord, JobState, job_id_for
from swarm_contracts.workers import RunningJob, WorkerOps
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

from .conftest import Harness, running_harness


async def ops_table(h: Harness) -> RecordTable[WorkerOps]:
    return RecordTable(await kv_bucket(h.js, h.subjects, "worker_ops"), WorkerOps)


def on(worker_id: str) -> Callable[[JobRecord], bool]:
    return lambda r: r.state == JobState.assigned and r.worker_id == worker_id


async def test_a_cordon_outlives_a_scheduler_restart_until_uncordoned(
    settings: Settings, tmp_path: Path
) -> None:
    # Best fit prefers the small worker; cordoned, it gets nothing.
    kw = {"worker_timeout_s": 30.0}
    async with running_harness(settings, tmp_path, **kw) as h:
        await (await ops_table(h)).put("small", WorkerOps(worker_id="small", cordoned=True))
        async with h.beating("small", cpus=2), h.beating("big", cpus=8):
            await h.submit(h.spec(), msg_id="one")
            await h.wait_record(job_id_for("default", "one"), on("big"))
    # A new scheduler process: the cordon comes from the bucket, not from memory.
    async with (
        running_harness(settings, tmp_path / "again", **kw) as h,
        h.beating("small", cpus=2),
        h.beating("big", cpus=8),
    ):
        await asyncio.sleep(0.5)
        await h.submit(h.spec(), msg_id="two")
        await h.wait_record(job_id_for("default", "two"), on("big"))
        await (await ops_table(h)).delete("small")
        await h.submit(h.spec(), msg_id="three")
        await h.wait_record(job_id_for("default", "three"), on("small"))


async def test_a_drain_with_move_asks_the_worker_to_hand_its_jobs_back(harness: Harness) -> None:
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    listed: list[RunningJob] = []
    release = await harness.nc.subscribe(harness.subjects.release("w1"))
    async with harness.beating("w1", running=lambda: listed, cpus=2):
        await harness.wait_record(job_id, on("w1"))
        await harness.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
        listed.append(RunningJob(job_id=job_id, attempt=1))
        await harness.wait_record(job_id, lambda r: r.state == JobState.running)
        drain = WorkerOps(worker_id="w1", cordoned=True, drain=True, move_jobs=True, reason="x")
        await (await ops_table(harness)).put("w1", drain)
        msg = await release.next_msg(timeout=10)
        request = json.loads(msg.data)["data"]
        assert request == {"worker_id": "w1", "job_ids": [job_id], "reason": "x"}

        # The worker checkpoints and hands it back: requeued at once, and placed elsewhere
        # (the drained worker gets nothing new), not counted against max_attempts (2 here).
        listed.clear()
        await harness.emit(
            Released(job_id=job_id, attempt=1, worker_id="w1", reason="x", last_checkpoint_step=3)
        )
        queued = await harness.wait_record(job_id, lambda r: r.state == JobState.queued)
        assert "checkpoint at step 3" in (queued.reason or "")
        async with harness.beating("w2", cpus=2):
            record = await harness.wait_record(job_id, on("w2"))
    assert record.attempt == 2


async def test_a_leaving_worker_gets_nothing_and_its_goodbye_requeues_its_jobs_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    # A long timeout: only the goodbye can explain a prompt requeue.
    async with running_harness(settings, tmp_path, worker_timeout_s=60.0) as h:
        first, second = job_id_for("default", "a"), job_id_for("default", "b")
        await h.heartbeat("w1", cpus=1)
        await h.submit(h.spec(), msg_id="a")
        await h.wait_record(first, on("w1"))
        await h.heartbeat("w1", cpus=1, state="leaving")
        await h.heartbeat("w2", cpus=1, state="leaving")
        await h.submit(h.spec(), msg_id="b")
        waiting = await h.wait_record(second, lambda r: r.reason is not None)
        assert waiting.state == JobState.queued
        assert (
            waiting.reason == "waiting for a worker: none takes new jobs (w1 leaving, w2 leaving)"
        )

        await h.heartbeat("w1", cpus=1, state="gone")
        requeued: JobRecord = await h.wait_record(
            first, lambda r: r.state == JobState.queued, timeout=5
        )
        assert "worker shut down" in (requeued.reason or "")
        assert requeued.faults == 0  # it left on purpose: not a failed attempt
        await h.heartbeat("w3", cpus=2)
        await h.wait_record(first, on("w3"))
        await h.wait_record(second, on("w3"))


async def test_a_hand_back_for_the_worker_s_own_fault_counts_as_an_attempt(
    harness: Harness,
) -> None:
    """A worker whose store is unreachable hands the job back at once; unlike a drain, that
    counts against max_attempts (2 here), so a store that stays down ends the job."""
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    async with harness.beating("w1", cpus=2):
        for attempt in (1, 2):
            await harness.wait_record(job_id, lambda r, a=attempt: on("w1")(r) and r.attempt == a)
            await harness.emit(Started(job_id=job_id, attempt=attempt, worker_id="w1"))
            unreachable = Released(
                job_id=job_id, attempt=attempt, worker_id="w1", reason="store down", fault=True
            )
            await harness.emit(unreachable)
        record = await harness.wait_record(job_id, lambda r: r.state.terminal)
    assert record.state == JobState.failed
    assert record.attempt == 2
    assert "store down" in (record.reason or "")
    assert "gave up after 2 attempts" in (record.reason or "")

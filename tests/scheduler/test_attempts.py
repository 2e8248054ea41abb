"""Attempts are attempts: each has a lease of its own, and only failed ones are counted.

Against a real scheduler on a real nats-server, with timeouts of a second or two: the jobs here
run several times longer than every one of them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from swarm_contracts.events import Released, Started, Succeeded
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState, job_id_for
from swarm_contracts.workers import RunningJob
from swarm_runtime.settings import Settings

from .conftest import Harness, running_harness


def holds(worker_id: str, attempt: int) -> object:
    return lambda r: (
        r.worker_id == worker_id
        and r.attempt == attempt
        and r.state.value
        in (
            "assigned",
            "running",
        )
    )


async def current(h: Harness, job_id: str) -> JobRecord:
    found = await h.jobs.get(job_id)
    assert found is not None
    return found[0]


async def test_a_job_that_ran_past_every_timeout_survives_losing_its_worker(
    settings: Settings, tmp_path: Path
) -> None:
    """Attempt 2 must not inherit attempt 1's "first seen running" time: it would be requeued
    at the first check after its ``started`` ("stopped listing it"), before its worker's next
    heartbeat lists it."""
    timeouts = {"assign_timeout_s": 2.0, "worker_timeout_s": 1.0, "max_attempts": 3}
    async with running_harness(settings, tmp_path, **timeouts) as h:
        job_id = job_id_for("default", "long")
        await h.submit(h.spec(), msg_id="long")
        first = [RunningJob(job_id=job_id, attempt=1)]
        async with h.beating("w1", running=lambda: first):
            await h.wait_record(job_id, holds("w1", 1))
            await h.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
            await asyncio.sleep(3 * 2.0)  # listed all along, well past the assign timeout
            record = await current(h, job_id)
            assert (record.state, record.attempt) == (JobState.running, 1)

        # w1 dies. w2 gets attempt 2 and starts it before a heartbeat of its lists it.
        second: list[RunningJob] = []
        async with h.beating("w2", running=lambda: second):
            await h.wait_record(job_id, holds("w2", 2), timeout=10)
            await h.emit(Started(job_id=job_id, attempt=2, worker_id="w2"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
            await asyncio.sleep(1.2)  # a liveness check or two before the listing comes
            second.append(RunningJob(job_id=job_id, attempt=2))
            await asyncio.sleep(3 * 2.0)
            record = await current(h, job_id)
            assert (record.state, record.attempt, record.worker_id) == (JobState.running, 2, "w2")
            adapter = AdapterRef(name="adapter", version=1, store_key="adapters/default/a/1")
            await h.emit(Succeeded(job_id=job_id, attempt=2, adapter=adapter))
            done = await h.wait_record(job_id, lambda r: r.state.terminal)
    assert (done.state, done.attempt, done.faults) == (JobState.succeeded, 2, 1)


async def test_hand_backs_never_use_up_attempts(settings: Settings, tmp_path: Path) -> None:
    """Three hand-backs, then two lost workers: only the losses count (max_attempts 2)."""
    async with running_harness(settings, tmp_path, worker_timeout_s=1.0, max_attempts=2) as h:
        job_id = job_id_for("default", "k")
        await h.submit(h.spec(), msg_id="k")
        async with h.beating("w1"):
            for attempt in (1, 2, 3):
                await h.wait_record(job_id, holds("w1", attempt))
                await h.emit(Started(job_id=job_id, attempt=attempt, worker_id="w1"))
                back = Released(job_id=job_id, attempt=attempt, worker_id="w1", reason="drain")
                await h.emit(back)
            await h.wait_record(job_id, holds("w1", 4))
            await h.emit(Started(job_id=job_id, attempt=4, worker_id="w1"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
        # w1 is lost: one failed attempt of two allowed, so the job goes on.
        async with h.beating("w2"):
            await h.wait_record(job_id, holds("w2", 5), timeout=10)
        record = await h.wait_record(job_id, lambda r: r.state.terminal, timeout=10)
    assert record.state == JobState.failed
    assert record.reason == "worker w2 lost; gave up after 2 attempts"
    assert (record.attempt, record.faults) == (5, 2)


async def test_a_restarted_worker_s_jobs_are_taken_back_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    """A worker whose new process says ``starting`` runs nothing: the job the record gives it
    is requeued at its first heartbeat, not a lease later (both are a minute here), and the
    starting worker gets no job until it says it is alive."""
    long = {"worker_timeout_s": 60.0, "assign_timeout_s": 60.0}
    async with running_harness(settings, tmp_path, **long) as h:
        job_id = job_id_for("default", "k")
        await h.heartbeat("w1")
        await h.submit(h.spec(), msg_id="k")
        await h.wait_record(job_id, holds("w1", 1))
        await h.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
        await h.wait_record(job_id, lambda r: r.state == JobState.running)

        await h.heartbeat("w1", state="starting")  # killed, and started again
        requeued = await h.wait_record(job_id, lambda r: r.state == JobState.queued, timeout=5)
        assert "worker w1 restarted" in (requeued.reason or "")
        assert requeued.faults == 1
        await asyncio.sleep(1.5)  # placement passes: a starting worker takes nothing
        assert (await current(h, job_id)).state == JobState.queued
        await h.heartbeat("w1")
        await h.wait_record(job_id, holds("w1", 2))

"""Queue policy, leases and cancellation against a real scheduler, registry and nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from swarm_contracts.events import Started
from swarm_contracts.jobs import JobRecord, JobState, job_id_for
from swarm_contracts.workers import Gpu, RunningJob
from swarm_runtime.settings import Settings

from .conftest import Harness, running_harness


def names(events: list[dict]) -> list[str]:
    return [e["data"]["event"] for e in events]


async def test_a_flood_from_one_tenant_does_not_starve_another(harness: Harness) -> None:
    for i in range(6):
        await harness.submit(harness.spec(), msg_id=f"a-{i}", tenant="a")
    a_ids = [job_id_for("a", f"a-{i}") for i in range(6)]
    for job_id in a_ids:
        await harness.wait_record(job_id, lambda r: r.state == JobState.queued)
    await harness.submit(harness.spec(), msg_id="b-0", tenant="b")
    b_id = job_id_for("b", "b-0")
    await harness.wait_record(b_id, lambda r: r.state == JobState.queued)

    await harness.heartbeat("w1", cpus=2)  # room for two jobs
    b = await harness.wait_record(b_id, lambda r: r.state == JobState.assigned)
    assert b.worker_id == "w1"
    assigned = [j for j in a_ids if (await harness.jobs.get(j))[0].state == JobState.assigned]  # type: ignore[index]
    assert assigned == [a_ids[0]]  # tenant a's oldest job, and only one


async def test_labels_and_gpu_memory_pick_the_worker_and_explain_a_wait(
    harness: Harness,
) -> None:
    resources = {"gpus_per_worker": 1, "min_gpu_memory_gb": 40, "labels": {"region": "eu"}}
    await harness.submit(harness.spec(resources=resources), msg_id="k")
    job_id = job_id_for("default", "k")
    small = [Gpu(index=0, name="L4", memory_bytes=24 << 30)]
    big = [Gpu(index=0, name="H100", memory_bytes=80 << 30)]
    await harness.heartbeat("us-big", gpus=big, labels={"region": "us"})
    await harness.wait_record(job_id, lambda r: r.reason == "no alive worker has labels region=eu")
    await harness.heartbeat("eu-small", gpus=small, labels={"region": "eu"})
    await harness.wait_record(job_id, lambda r: "≥ 40 GB" in (r.reason or ""))
    await harness.heartbeat("eu-big", gpus=big, labels={"region": "eu", "provider": "acme"})
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    assert record.worker_id == "eu-big"


async def test_the_tenant_limit_holds_a_tenant_s_extra_jobs(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, tenant_max_running=1) as h:
        for i in range(2):
            await h.submit(h.spec(), msg_id=f"a-{i}", tenant="a")
        first, second = job_id_for("a", "a-0"), job_id_for("a", "a-1")
        await h.wait_record(second, lambda r: r.state == JobState.queued)
        # Beating throughout: the second job's reason is written only after it has waited a
        # moment, and a worker heard once would be lost (1.5 s) before that on a loaded machine.
        async with h.beating("w1", cpus=4):
            await h.wait_record(first, lambda r: r.state == JobState.assigned)
            waiting = await h.wait_record(
                second, lambda r: r.reason is not None and "limit" in r.reason
            )
        assert waiting.reason == "tenant a is at its limit of 1 running job"


async def test_an_assignment_never_confirmed_is_requeued_then_given_up(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, assign_timeout_s=1.0) as h:
        await h.submit(h.spec(), msg_id="k")
        job_id = job_id_for("default", "k")
        async with h.beating("mute"):  # alive, but never emits `started`
            record = await h.wait_record(job_id, lambda r: r.state == JobState.failed)
        assert record.attempt == 2
        assert record.reason == ("worker mute did not start it within 1s; gave up after 2 attempts")
        assert names(await h.events(job_id)) == [
            "queued",
            "assigned",
            "requeued",
            "assigned",
            "failed",
        ]


async def test_a_running_job_its_worker_stops_listing_is_requeued(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, assign_timeout_s=1.5) as h:
        await h.submit(h.spec(), msg_id="k")
        job_id = job_id_for("default", "k")
        listing: list[RunningJob] = []
        async with h.beating("w1", running=lambda: listing):
            await h.wait_record(job_id, lambda r: r.state == JobState.assigned)
            listing.append(RunningJob(job_id=job_id, attempt=1))
            await h.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
            await asyncio.sleep(2.5)  # listed all along: the lease holds
            assert (await h.jobs.get(job_id))[0].state == JobState.running  # type: ignore[index]
            listing.clear()  # the worker forgot the job (its run crashed, say)
            record = await h.wait_record(job_id, lambda r: r.attempt == 2)
        assert record.worker_id == "w1"  # the only worker: placed again, as attempt 2
        requeued = [e["data"] for e in await h.events(job_id) if e["data"]["event"] == "requeued"]
        assert requeued[0]["reason"] == "worker w1 stopped listing it for 1.5s"


async def test_a_stale_worker_listing_an_old_attempt_does_not_break_the_new_lease(
    settings: Settings, tmp_path: Path
) -> None:
    """A worker frozen past its lease wakes up and lists attempt 1 until it notices."""
    async with running_harness(settings, tmp_path, assign_timeout_s=1.5) as h:
        await h.submit(h.spec(), msg_id="k")
        job_id = job_id_for("default", "k")
        listing: list[RunningJob] = []
        async with h.beating("w1", running=lambda: listing):
            # Attempt 1 is never confirmed: requeued, and placed on w1 again as attempt 2.
            await h.wait_record(job_id, lambda r: r.attempt == 2)
            listing.append(RunningJob(job_id=job_id, attempt=2))
            await h.emit(Started(job_id=job_id, attempt=2, worker_id="w1"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
            stale = [RunningJob(job_id=job_id, attempt=1)]
            async with h.beating("ghost", running=lambda: stale, cpus=0):
                await asyncio.sleep(4)  # well past the 1.5 s lease
            record = (await h.jobs.get(job_id))[0]  # type: ignore[index]
        assert record.state == JobState.running, record.reason
        assert record.attempt == 2, record.reason


async def test_a_cancelled_job_whose_worker_never_starts_it_is_ended(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, cancel_grace_s=0.5) as h:
        await h.submit(h.spec(), msg_id="k")
        job_id = job_id_for("default", "k")
        async with h.beating("w1"):
            await h.wait_record(job_id, lambda r: r.state == JobState.assigned)
            await h.cancel(job_id)
            record: JobRecord = await h.wait_record(job_id, lambda r: r.state == JobState.cancelled)
        assert record.reason == "cancelled before worker w1 started it"
        assert names(await h.events(job_id))[-1] == "cancelled"

"""Several scheduler processes: one leads through the `leader` bucket, another takes over."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from swarm_contracts.jobs import JobState, job_id_for
from swarm_contracts.subjects import Subjects
from swarm_runtime.leader import Leadership
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_scheduler.app import build_app as build_scheduler
from swarm_scheduler.scheduler import Scheduler

from .conftest import Harness, running_harness


async def test_one_leader_at_a_time_and_a_takeover_only_after_the_lease(
    settings: Settings,
) -> None:
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    subjects = Subjects(settings.namespace)
    await ensure_topology(js, subjects)
    kv = await kv_bucket(js, subjects, "leader")
    changes: list[tuple[str, bool]] = []

    def member(name: str) -> Leadership:
        async def note(leading: bool) -> None:
            changes.append((name, leading))

        return Leadership(kv, "scheduler", name, lease_s=1.0, on_change=note)

    a, b = member("a"), member("b")
    await a.tick()
    await b.tick()
    assert (a.leading, b.leading) == (True, False)
    a.start()
    b.start()
    await asyncio.sleep(2.5)  # a renews: b never takes over
    assert (a.leading, b.leading) == (True, False)

    assert a._task is not None
    a._task.cancel()  # a freezes (no renewals, no hand-back), like a killed process
    await asyncio.sleep(0.5)
    assert not b.leading  # not before the lease is over
    await asyncio.sleep(2.0)
    assert b.leading
    await a.tick()  # a wakes up: its renewal fails the compare-and-set, it steps down
    assert not a.leading
    assert changes == [("a", True), ("b", True), ("a", False)]
    await b.stop()
    await nc.close()


async def test_a_follower_takes_over_the_work_when_the_leader_stops(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, leader_lease_s=1.0) as h:
        follower_app = build_scheduler(h.settings)
        async with follower_app:
            follower: Scheduler = follower_app.context.get("scheduler")
            await asyncio.sleep(1.0)
            assert not follower.leading
            # While the first scheduler leads, the follower takes no work.
            await h.submit(h.spec(), msg_id="k1")
            await h.wait_record(job_id_for("default", "k1"), lambda r: r.state == JobState.queued)
            await _stop_first_scheduler(h)
            deadline = asyncio.get_running_loop().time() + 10
            while not follower.leading:
                assert asyncio.get_running_loop().time() < deadline, "no takeover"
                await asyncio.sleep(0.1)
            # The new leader consumes submissions and places from the records it rebuilt.
            await h.submit(h.spec(), msg_id="k2")
            async with h.beating("w1", cpus=2):
                for key in ("k1", "k2"):
                    record = await h.wait_record(
                        job_id_for("default", key), lambda r: r.state == JobState.assigned
                    )
                    assert (record.worker_id, record.attempt) == ("w1", 1)
            assert sorted(await h.jobs.keys()) == sorted(
                job_id_for("default", k) for k in ("k1", "k2")
            )


async def _stop_first_scheduler(h: Harness) -> None:
    """Freeze the harness's scheduler as a crashed process would be: no renewals, no hand-back
    of the lease (so the follower must wait it out), no more work."""
    assert h.scheduler is not None
    leadership = h.scheduler.lead.leadership
    assert leadership is not None
    assert leadership.leading
    assert leadership._task is not None
    leadership._task.cancel()
    await leadership._set(False)  # stops its consumers and placement

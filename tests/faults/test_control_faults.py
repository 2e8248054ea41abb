"""The scheduler leader killed and the broker restarted mid-run: every job still ends once."""

from __future__ import annotations

import time

import pytest

from swarm_contracts.jobs import JobState

from .conftest import Procs, done, start_base

# Real processes, each trainer with its own Ray cluster: beside another such test on a loaded
# two-core machine one can take longer than the suite's 600 s per test; its own waits bound it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_killing_the_leader_scheduler_repeatedly_loses_and_doubles_nothing(
    procs: Procs,
) -> None:
    dataset = start_base(procs, schedulers=2)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1", SWARM_TRAINER_CPUS="2")
    jobs = [procs.submit(dataset, f"ha{i}", steps=6) for i in range(3)]
    for round_ in range(3):
        time.sleep(4)
        victim = f"scheduler{round_ % 2}"
        procs.kill(victim)
        procs.start(victim, "scheduler")  # comes back as a follower
    for job_id in jobs:
        record = procs.wait(job_id, done, timeout=240)
        assert record.state == JobState.succeeded, record
    for i in range(3):
        assert len(procs.adapter_versions(f"a-ha{i}")) == 1
    for job_id in jobs:  # one assignment per attempt, never two live attempts
        assigned = [e["attempt"] for e in procs.events(job_id) if e["event"] == "assigned"]
        assert len(assigned) == len(set(assigned))


def test_a_nats_restart_mid_run_loses_no_job(procs: Procs) -> None:
    dataset = start_base(procs)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1", SWARM_TRAINER_CPUS="2")
    jobs = [procs.submit(dataset, f"nr{i}", steps=8) for i in range(2)]
    procs.wait(jobs[0], lambda r: r.state == JobState.running)
    procs.nats.stop()
    time.sleep(2)
    procs.nats.start()  # same port and store directory
    for job_id in jobs:
        assert procs.wait(job_id, done, timeout=240).state == JobState.succeeded

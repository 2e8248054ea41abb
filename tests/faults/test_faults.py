"""Kill, freeze and restart real processes mid-run; every job still ends exactly once."""

from __future__ import annotations

import signal
import time

import pytest

from swarm_common.jobs import JobState

from .conftest import Procs, done

pytestmark = pytest.mark.slow

BASE = ("gateway", "registry", "scheduler")


def start_base(procs: Procs, schedulers: int = 1) -> str:
    for svc in ("gateway", "registry"):
        procs.start(svc, svc)
    for i in range(schedulers):
        procs.start(f"scheduler{i}", "scheduler")
    procs.wait_gateway()
    return procs.prepare_inputs()


def test_a_killed_trainer_s_job_resumes_on_the_other_from_its_checkpoint(procs: Procs) -> None:
    dataset = start_base(procs)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1")
    job_id = procs.submit(dataset, "resume", steps=10, checkpoint_every=3)
    first = procs.wait(job_id, lambda r: r.metrics.get("checkpoint_step", 0) >= 3)
    procs.start("t2", "trainer", SWARM_WORKER_ID="t2")
    procs.kill(first.worker_id or "t1")
    record = procs.wait(job_id, done, timeout=240)
    assert record.state == JobState.succeeded and record.worker_id == "t2"
    started = [e for e in procs.events(job_id) if e["event"] == "started"]
    assert started[-1]["attempt"] == 2 and started[-1]["resumed_from_step"] >= 3
    assert len(procs.adapter_versions("a-resume")) == 1


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


def test_a_frozen_trainer_s_late_events_are_rejected(procs: Procs) -> None:
    dataset = start_base(procs)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1")
    job_id = procs.submit(dataset, "frozen", steps=30, checkpoint_every=3)
    # Frozen with a checkpoint behind it: attempt 2 resumes from it while attempt 1, once woken,
    # could go on checkpointing and pruning (in its own Ray run, never in attempt 2's).
    procs.wait(job_id, lambda r: r.metrics.get("checkpoint_step", 0) >= 3)
    procs.kill("t1", signal.SIGSTOP)
    procs.start("t2", "trainer", SWARM_WORKER_ID="t2")
    procs.wait(job_id, lambda r: r.attempt == 2, timeout=90)
    procs.kill("t1", signal.SIGCONT)  # wakes up still believing it runs attempt 1
    record = procs.wait(job_id, done, timeout=300)
    assert record.state == JobState.succeeded and record.attempt == 2, record.reason
    assert record.worker_id == "t2"
    assert len(procs.adapter_versions("a-frozen")) == 1
    events = procs.events(job_id)  # up to the first final event: attempt 1 sent none
    assert (events[-1]["event"], events[-1]["attempt"]) == ("succeeded", 2)
    started = [e for e in events if e["event"] == "started"]
    assert started[-1]["attempt"] == 2 and started[-1]["resumed_from_step"] >= 3
    procs.wait_worker("t1", lambda w: not w["running"])  # it noticed and stopped its run


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

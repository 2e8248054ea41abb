"""A trainer killed or frozen mid-run: its job resumes elsewhere from its checkpoint, once."""

from __future__ import annotations

import signal

import pytest

from swarm_contracts.jobs import JobState

from .conftest import Procs, done, start_base

# Real processes, each trainer with its own Ray cluster: beside another such test on a loaded
# two-core machine one can take longer than the suite's 600 s per test; its own waits bound it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_killed_trainer_s_job_resumes_on_the_other_from_its_checkpoint(procs: Procs) -> None:
    dataset = start_base(procs)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1")
    job_id = procs.submit(dataset, "resume", steps=10, checkpoint_every=3)
    first = procs.wait(job_id, lambda r: r.metrics.get("checkpoint_step", 0) >= 3)
    procs.start("t2", "trainer", SWARM_WORKER_ID="t2")
    procs.kill(first.worker_id or "t1")
    record = procs.wait(job_id, done, timeout=240)
    assert record.state == JobState.succeeded
    assert record.worker_id == "t2"
    started = [e for e in procs.events(job_id) if e["event"] == "started"]
    assert started[-1]["attempt"] == 2
    assert started[-1]["resumed_from_step"] >= 3
    assert len(procs.adapter_versions("a-resume")) == 1


def test_a_frozen_trainer_s_late_events_are_rejected(procs: Procs) -> None:
    # 10 s of silence, not 3: the frozen worker is lost all the same, but the one that takes
    # over is not (on a starved CI machine its heartbeats have come more than 3 s apart).
    dataset = start_base(procs, SWARM_WORKER_TIMEOUT_S="10")
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
    events = procs.events(job_id)  # up to the first final event: attempt 1 sent none
    why = [(e["event"], e.get("attempt"), e.get("reason")) for e in events]
    assert record.state == JobState.succeeded, (record.reason, why, procs.logs())
    assert record.attempt == 2, (why, procs.logs())
    assert record.worker_id == "t2"
    assert len(procs.adapter_versions("a-frozen")) == 1
    assert (events[-1]["event"], events[-1]["attempt"]) == ("succeeded", 2)
    started = [e for e in events if e["event"] == "started"]
    assert started[-1]["attempt"] == 2
    assert started[-1]["resumed_from_step"] >= 3
    procs.wait_worker("t1", lambda w: not w["running"])  # it noticed and stopped its run

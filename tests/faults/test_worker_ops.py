"""Operating real trainer agents: drain one with move_jobs, stop another with SIGTERM, uncordon.

Each hand-back commits a checkpoint of the step the run had reached (no periodic checkpoint is
due here: only the hand-backs save one) and the job is requeued at once, long before any lease
or heartbeat timeout could have moved it; the next attempt resumes exactly from that step.

The timeouts are long here, so that only a hand-back can move the job: a minute of heartbeat
silence, and three minutes to start an attempt (with other tests' Ray clusters on a two-core
CI machine, starting one may take longer than a minute).
"""

from __future__ import annotations

import signal
import time

import pytest

from swarm_contracts.jobs import JobState

from .conftest import Procs, done

# Real processes, each trainer with its own Ray cluster: beside another such test on a loaded
# two-core machine one can take longer than the suite's 600 s per test; its own waits bound it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PATIENT = {"SWARM_WORKER_TIMEOUT_S": "60", "SWARM_ASSIGN_TIMEOUT_S": "180"}


def test_drain_and_sigterm_hand_a_job_back_from_a_checkpoint_at_once(procs: Procs) -> None:
    for svc in ("gateway", "registry", "scheduler"):
        procs.start(svc, svc, **PATIENT)
    procs.wait_gateway()
    dataset = procs.prepare_inputs()
    for worker in ("t1", "t2"):
        procs.start(worker, "trainer", SWARM_WORKER_ID=worker, **PATIENT)
    for worker in ("t1", "t2"):
        procs.wait_worker(worker, lambda w: w["state"] == "alive", timeout=120)
    job_id = procs.submit(dataset, "ops", steps=400, checkpoint_every=1000)
    first = procs.wait(job_id, lambda r: r.metrics.get("step", 0) >= 3)
    assert first.worker_id is not None
    other = "t2" if first.worker_id == "t1" else "t1"

    # Drain with move: the job leaves the drained worker from a fresh checkpoint.
    r = procs.http.post(f"/v1/workers/{first.worker_id}/drain", json={"move_jobs": True})
    assert r.status_code == 200, r.text
    second = procs.wait(
        job_id, lambda r: r.attempt == 2 and r.state == JobState.running, timeout=120
    )
    assert second.worker_id == other
    events = procs.history(job_id)
    [released] = [e for e in events if e["event"] == "released"]
    assert released["attempt"] == 1
    assert released["worker_id"] == first.worker_id
    assert released["last_checkpoint_step"] >= 3
    started = [e for e in events if e["event"] == "started"]
    assert started[-1]["resumed_from_step"] == released["last_checkpoint_step"]

    # SIGTERM to the agent alone (its Ray processes must live to save the checkpoint).
    procs.wait(job_id, lambda r: r.metrics.get("step", 0) >= released["last_checkpoint_step"] + 3)
    sent = time.monotonic()
    procs.procs[other].send_signal(signal.SIGTERM)
    requeued = procs.wait(job_id, lambda r: r.state == JobState.queued, timeout=60)
    handed_back_s = time.monotonic() - sent
    assert requeued.attempt == 2
    assert procs.procs[other].wait(60) == 0
    assert handed_back_s < 30, handed_back_s  # no timeout (60 s, 180 s) came into it
    gone = procs.wait_worker(other, lambda w: w["state"] == "gone", timeout=10)
    assert gone["running"] == []

    # Nobody takes it (the only live worker is drained) until the drain ends.
    time.sleep(2)
    assert procs.job(job_id).state == JobState.queued
    assert procs.http.post(f"/v1/workers/{first.worker_id}/uncordon").status_code == 200
    record = procs.wait(job_id, done, timeout=240)
    events = procs.events(job_id)
    story = [(e["event"], e.get("attempt"), e.get("worker_id"), e.get("reason")) for e in events]
    assert record.state == JobState.succeeded, story
    assert (record.attempt, record.worker_id) == (3, first.worker_id), f"{story}\n{procs.logs()}"
    releases = [e for e in events if e["event"] == "released"]
    assert [e["attempt"] for e in releases] == [1, 2]
    started = [e for e in events if e["event"] == "started"]
    assert started[-1]["resumed_from_step"] == releases[-1]["last_checkpoint_step"]
    assert releases[-1]["last_checkpoint_step"] > releases[0]["last_checkpoint_step"]
    assert not [e for e in events if e["event"] in ("failed", "cancelled")]

"""A job that runs several times longer than every scheduler timeout survives worker losses.

Real processes: a gateway, a registry, a scheduler and two trainer agents, each with its own
Ray. The scheduler's timeouts are a few seconds (``LEASES``), and every fault strikes an
attempt that has run longer than all of them. Each killed or stopped agent is started again
under the same worker id, as ``swarm up`` does.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time

import pytest

from swarm_contracts.jobs import JobRecord, JobState

from .conftest import Procs, done, start_base

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ASSIGN_TIMEOUT_S = 8.0
WORKER_TIMEOUT_S = 5.0
LEASES = {
    "SWARM_ASSIGN_TIMEOUT_S": f"{ASSIGN_TIMEOUT_S:g}",
    "SWARM_WORKER_TIMEOUT_S": f"{WORKER_TIMEOUT_S:g}",
    "SWARM_CANCEL_GRACE_S": "4",
    # Three faults, two of them a lost worker: two failed attempts of the three allowed. A
    # hand-back counts nothing.
    "SWARM_MAX_ATTEMPTS": "3",
}
# Every step at least 0.4 s (swarm_trainer.hooks.SlowSteps): the job lasts whatever the
# machine's speed, and a cancel or hand-back is seen within a step.
TRAINER = {**LEASES, "SWARM_TRAINER_TEST_HOOK": "slow_steps", "SWARM_SHUTDOWN_GRACE_S": "90"}
FAULTS = (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)


def start_trainer(procs: Procs, name: str) -> None:
    procs.start(name, "trainer", SWARM_WORKER_ID=name, **TRAINER)


def test_a_long_job_survives_three_faults_in_a_row_and_a_cancel_is_prompt(procs: Procs) -> None:
    rng = random.Random(21)
    dataset = start_base(procs, **LEASES)
    for name in ("t1", "t2"):
        start_trainer(procs, name)
    job_id = procs.submit(dataset, "long", steps=100, checkpoint_every=10)

    for attempt, sig in enumerate(FAULTS, start=1):
        record = procs.wait(job_id, lambda r, a=attempt: r.attempt == a and running(r), 300)
        # Past every timeout of the scheduler, at a random point: in Ray's start of the run,
        # or training.
        time.sleep(ASSIGN_TIMEOUT_S + rng.uniform(1.0, 6.0))
        victim = record.worker_id or ""
        if sig == signal.SIGTERM:
            # To the agent alone (its Ray must live to save the checkpoint): it hands the job
            # back, then exits.
            procs.procs[victim].send_signal(signal.SIGTERM)
            procs.procs[victim].wait(150)
        with contextlib.suppress(ProcessLookupError):
            procs.kill(victim)  # with its Ray, as kill -9 of the agent's group under `swarm up`
        start_trainer(procs, victim)

    record = procs.wait(job_id, done, timeout=400)
    events = procs.events(job_id)
    why = [(e["event"], e.get("attempt"), e.get("reason")) for e in events]
    assert record.state == JobState.succeeded, (record.reason, why, procs.logs())
    assert record.attempt == len(FAULTS) + 1, why
    assert record.faults == 2, why  # the two kills; the hand-back counted nothing
    assert [e["event"] for e in events].count("succeeded") == 1
    assert len(procs.adapter_versions("a-long")) == 1
    # Requeued only for the faults: never for a lease inherited from an earlier attempt
    # ("stopped listing it") or a wait for the old run ("did not start it").
    requeues = [e.get("reason") or "" for e in events if e["event"] == "requeued"]
    assert len(requeues) == len(FAULTS), why
    assert all(("lost" in r or "restarted" in r or "handed back" in r) for r in requeues), why

    # A cancel while Ray starts an attempt (the job is running: `started` went out before
    # the Ray run) takes effect within seconds.
    job_id = procs.submit(dataset, "cancelled", steps=100)
    procs.wait(job_id, running, 300)
    asked = time.monotonic()
    r = procs.http.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 202, r.text
    record = procs.wait(job_id, done, timeout=30)
    took = time.monotonic() - asked
    assert record.state == JobState.cancelled, record.reason
    assert took <= 5.0, (took, procs.logs())


def running(record: JobRecord) -> bool:
    return record.state == JobState.running

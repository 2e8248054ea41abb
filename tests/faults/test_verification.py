"""Verification of untrusted work with real trainer agents: a deliberately dishonest worker (it
perturbs its LoRA weights before every checkpoint) is caught by a replay on another worker,
and an honest worker's job passes its replay on a third one.

The scheduler verifies every job (``SWARM_VERIFY_FRACTION=1``). Jobs of 6 steps checkpoint at
2, 4 and 6; Ray keeps the last two, so each replay trains steps 5 and 6 from the checkpoint at
4 and compares with the one at 6: an overhead of 2/6.
"""

from __future__ import annotations

import time

import pytest

from swarm_contracts.jobs import JobState

from .conftest import Procs, done

# Real processes, each trainer with its own Ray cluster: beside another such test on a loaded
# two-core machine one can take longer than the suite's 600 s per test; its own waits bound it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PATIENT = {"SWARM_WORKER_TIMEOUT_S": "60", "SWARM_ASSIGN_TIMEOUT_S": "120"}
STEPS = {"steps": 6, "checkpoint_every": 2}


def verified_event(procs: Procs, job_id: str) -> dict:
    """The job's ``verified`` event: the last of its SSE stream, which the gateway ends there
    (past the ``succeeded`` and the ``failed`` before it) once the verification is done."""
    events = procs.events(job_id)
    assert events[-1]["event"] == "verified", [e["event"] for e in events]
    return events[-1]


def test_a_replay_catches_a_dishonest_worker_and_passes_an_honest_one(procs: Procs) -> None:
    procs.start("gateway", "gateway", **PATIENT)
    procs.start("registry", "registry", **PATIENT)
    procs.start("scheduler", "scheduler", SWARM_VERIFY_FRACTION="1", **PATIENT)
    procs.wait_gateway()
    dataset = procs.prepare_inputs()
    procs.start(
        "cheat",
        "trainer",
        SWARM_WORKER_ID="cheat",
        SWARM_TRAINER_TEST_HOOK="perturb_checkpoints",
        **PATIENT,
    )
    procs.start("honest", "trainer", SWARM_WORKER_ID="honest", **PATIENT)
    for worker in ("cheat", "honest"):
        procs.wait_worker(worker, lambda w: w["state"] == "alive", timeout=120)

    # The dishonest worker trains the first job (the honest one is cordoned meanwhile).
    assert procs.http.post("/v1/workers/honest/cordon").status_code == 200
    procs.wait_worker("honest", lambda w: w["cordoned"])
    time.sleep(1)  # the scheduler follows the bucket by a watch
    cheated = procs.submit(dataset, "cheated", **STEPS)
    record = procs.wait(cheated, lambda r: r.state == JobState.succeeded)
    assert record.worker_id == "cheat"
    assert record.checkpoints == [4, 6]
    # Its replay may not run where it was trained: it waits for another worker.
    replay_id = procs.wait(cheated, lambda r: r.verification is not None).verification.replay_job_id  # type: ignore[union-attr]
    waiting = procs.wait(replay_id, lambda r: r.reason is not None and "replay" in r.reason)
    assert waiting.state == JobState.queued
    assert waiting.verify is not None
    assert (waiting.verify.job_id, waiting.verify.worker_id) == (cheated, "cheat")
    assert procs.http.post("/v1/workers/honest/uncordon").status_code == 200

    # The honest worker replays steps 5-6 and the weights do not match: caught.
    caught = procs.wait(cheated, lambda r: r.state == JobState.failed, timeout=240)
    assert caught.reason is not None
    assert caught.reason.startswith("verification failed")
    assert caught.verification is not None
    assert caught.verification.outcome == "failed"
    replay = procs.job(replay_id)
    assert (replay.state, replay.worker_id) == (JobState.succeeded, "honest")
    verified = verified_event(procs, cheated)
    assert verified["outcome"] == "failed"
    assert (verified["worker_id"], verified["replay_worker_id"]) == ("cheat", "honest")
    assert (verified["from_step"], verified["to_step"]) == (4, 6)
    assert verified["max_relative_l2"] > verified["tolerance"]
    assert verified["action"] == "failed"
    assert (verified["replayed_steps"], verified["job_steps"]) == (2, 6)
    assert verified["overhead"] == pytest.approx(2 / 6)
    cheat = procs.wait_worker("cheat", lambda w: w["suspect"])
    assert cheat["cordoned"]  # no new jobs

    # A third worker comes (the dishonest one goes); the next job can only go to the honest
    # one, and its replay only to the newcomer: it passes.
    procs.kill("cheat")
    procs.start("honest2", "trainer", SWARM_WORKER_ID="honest2", **PATIENT)
    fair = procs.submit(dataset, "fair", **STEPS)
    record = procs.wait(fair, lambda r: r.state == JobState.succeeded, timeout=240)
    assert record.worker_id == "honest"
    passed = procs.wait(
        fair,
        lambda r: r.verification is not None and r.verification.outcome != "pending",
        timeout=240,
    )
    assert passed.verification is not None
    assert passed.verification.outcome == "passed", passed.verification.reason
    assert passed.state == JobState.succeeded
    verified = verified_event(procs, fair)
    assert (verified["outcome"], verified["action"]) == ("passed", "none")
    assert verified["replay_worker_id"] == "honest2"
    assert verified["max_relative_l2"] <= verified["tolerance"]
    assert verified["max_loss_difference"] is not None  # the losses were compared too
    assert procs.wait_worker("honest", lambda w: not w["suspect"])

    # An operator clears the suspicion.
    r = procs.http.post("/v1/workers/cheat/clear")
    assert r.status_code == 200, r.text
    assert not r.json()["suspect"]
    assert done(procs.job(cheated))

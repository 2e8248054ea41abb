"""A DPO job run as every job is (Ray Train, the recipe, checkpoints in the store): its steps
and evaluations report the rewards, a run killed mid-job resumes bit-exactly from its last
committed checkpoint, and a verification replay of its steps reaches the same adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_contracts.verification import ReplayReport, VerifyTarget
from swarm_runtime.store import LocalStore
from swarm_trainer.hooks import CrashBeforeStep
from swarm_trainer.reports import Progress, Started, Validated
from swarm_trainer.run import RunResult, committed_checkpoint_step, run_job
from swarm_trainer.settings import TrainerSettings

from ..conftest import drain, make_assignment

pytestmark = pytest.mark.slow

DPO = {"type": "dpo", "beta": 0.5}
# Dropout > 0 makes every step draw random numbers: a resume that did not restore the RNG
# streams would diverge. Packing: both sequences of every pair in one row.
LORA = {"dropout": 0.2}
TRAINING = {"max_steps": 8, "checkpoint_every": 4, "eval_every": 4, "seed": 5, "packing": True}
REWARDS = {"reward_accuracy", "chosen_reward", "rejected_reward", "margin"}


def test_a_dpo_job_reports_rewards_resumes_exactly_and_replays_to_the_same_adapter(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from swarm_trainer.control import make_control

    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(
        store,
        tiny_model_dir,
        job_id="job-dddddddddddddddddddd",
        training=TRAINING,
        lora=LORA,
        method=DPO,
    )
    # The worker dies before step 7, after committing step 4; Ray restarts the worker group.
    hooks = CrashBeforeStep(step=7, marker=str(tmp_path / "crashed-once"))
    control = make_control()
    result = run_job(job, settings, store, control=control, max_failures=1, hooks=hooks)
    assert isinstance(result, RunResult)
    assert (tmp_path / "crashed-once").read_text() == "6"
    messages = drain(control)
    assert [m.resumed_from_step for m in messages if isinstance(m, Started)] == [0, 4]
    restart = next(
        i for i, m in enumerate(messages) if isinstance(m, Started) and m.resumed_from_step == 4
    )
    before = {m.step: m for m in messages[:restart] if isinstance(m, Progress)}
    after = {m.step: m for m in messages[restart:] if isinstance(m, Progress)}
    assert sorted(before) == [1, 2, 3, 4, 5, 6]
    assert sorted(after) == [5, 6, 7, 8]

    # Steps 5 and 6 again from the step-4 checkpoint: the same losses and rewards, bit for bit.
    for step in (5, 6):
        assert after[step].loss == before[step].loss, step
        assert after[step].metrics == before[step].metrics, step
    # Every step reports DPO's measures; a fresh adapter starts at the reference (loss log 2).
    for progress in (*before.values(), *after.values()):
        assert set(progress.metrics) == REWARDS
    assert before[1].loss == pytest.approx(0.6931, abs=1e-3)
    assert before[1].metrics["margin"] == pytest.approx(0.0, abs=1e-6)
    assert after[8].metrics["margin"] > 0  # it learned to prefer the right sums
    validated = [m for m in messages if isinstance(m, Validated)]
    assert validated
    assert all(set(v.metrics) == REWARDS for v in validated)
    assert [e.step for e in result.metrics.eval_history] == [4, 8]

    # A replay of steps 5..8 from the committed step-4 checkpoint (as the scheduler asks a
    # verifier) reaches the adapter the job committed at step 8.
    assert committed_checkpoint_step(store, job.job_id, 1) == 8
    replay = job.model_copy(
        update={
            "job_id": "job-eeeeeeeeeeeeeeeeeeee",
            "worker_id": "w2",
            "verify": VerifyTarget(
                job_id=job.job_id, attempt=1, worker_id="w1", from_step=4, to_step=8
            ),
        }
    )
    report = run_job(replay, settings, store)
    assert isinstance(report, ReplayReport)
    assert report.missing == []
    assert report.distances
    assert max(report.distances.values()) == 0.0
    assert report.losses == {step: after[step].loss for step in (5, 6, 7, 8)}

"""Exact resume: a run killed mid-job continues from its last committed checkpoint with the
losses an uninterrupted run has, step for step, bit for bit; a half-written checkpoint is never
used. The same holds across attempts: a new attempt's Ray run resumes from what an earlier one
committed. The dataset is streamed in many frames (``swarm_trainer.stream``), and the runs stop
mid-epoch, mid-frame: the stream position each rank saved puts them back on the same batches.
An attempt with another number of workers is refused, not resumed on other data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from swarm_contracts.workers import Assignment
from swarm_runtime.store import LocalStore
from swarm_trainer.hooks import CrashBeforeStep
from swarm_trainer.reports import Progress, Report, Started
from swarm_trainer.run import RunResult, committed_checkpoint_step, run_job
from swarm_trainer.settings import TrainerSettings

from .conftest import drain, make_assignment

pytestmark = pytest.mark.slow

# Dropout > 0 makes every step draw random numbers: a resume that did not restore the RNG
# streams would diverge from the uninterrupted run.
LORA = {"dropout": 0.2}
TRAINING = {"max_steps": 8, "checkpoint_every": 4, "eval_every": 4, "seed": 3}
# Frames of about 500 bytes: the 48 records make 6, more than the 4 a rank needs to take its
# own frames; an epoch is 5 steps of 8, so the crash and the resume fall mid-epoch.
FRAME = 500


def losses_by_step(messages: list[Report]) -> dict[int, float]:
    return {m.step: m.loss for m in messages if isinstance(m, Progress)}


def resumed_from(messages: list[Report]) -> list[int]:
    return [m.resumed_from_step for m in messages if isinstance(m, Started)]


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run: its losses by step, its result, and where it ran."""

    losses: dict[int, float]
    result: RunResult
    job: Assignment
    settings: TrainerSettings
    store: LocalStore


@pytest.fixture(scope="module")
def reference(
    ray_cluster: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    from swarm_trainer.control import make_control

    tmp_path = tmp_path_factory.mktemp("reference")
    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(
        store,
        tiny_model_dir,
        job_id="job-aaaaaaaaaaaaaaaaaaaa",
        training=TRAINING,
        lora=LORA,
        frame_bytes=FRAME,
    )
    control = make_control()
    result = run_job(job, settings, store, control=control)
    assert result is not None
    expected = losses_by_step(drain(control))
    assert sorted(expected) == list(range(1, 9))
    return Reference(expected, result, job, settings, store)


def crash_hooks(tmp_path: Path) -> CrashBeforeStep:
    """Rank 0's worker dies before step 7, leaving a half-written checkpoint_00000006."""
    return CrashBeforeStep(step=7, marker=str(tmp_path / "crashed-once"))


def test_killed_run_resumes_exactly_from_last_committed_checkpoint(
    reference: Reference, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from swarm_trainer.control import make_control

    expected, ref_result = reference.losses, reference.result
    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")

    # Same job under another id; its worker process dies before step 7, after leaving a
    # half-written checkpoint_00000006 in the run directory. Ray restarts the worker group.
    crashed = make_assignment(
        store,
        tiny_model_dir,
        job_id="job-bbbbbbbbbbbbbbbbbbbb",
        training=TRAINING,
        lora=LORA,
        frame_bytes=FRAME,
    )
    hooks = crash_hooks(tmp_path)
    control = make_control()
    result = run_job(crashed, settings, store, control=control, max_failures=1, hooks=hooks)
    assert result is not None
    assert (tmp_path / "crashed-once").read_text() == "6"  # it really died at that point
    messages = drain(control)

    # Two starts: from scratch, then from step 4, the last committed checkpoint; not from the
    # partial step-6 directory, which is still there.
    assert resumed_from(messages) == [0, 4]
    assert store.exists(
        f"checkpoints/{crashed.job_id}/attempt-1/checkpoint_00000006/adapter_model.safetensors"
    )
    restart = next(
        i for i, m in enumerate(messages) if isinstance(m, Started) and m.resumed_from_step == 4
    )
    before, after = losses_by_step(messages[:restart]), losses_by_step(messages[restart:])
    assert sorted(before) == [1, 2, 3, 4, 5, 6]
    assert sorted(after) == [5, 6, 7, 8]

    # Same seed, same losses (reproducibility), and the resumed steps match the reference,
    # bit for bit: the same batches, weights, optimizer state and dropout masks.
    assert before == {step: expected[step] for step in before}
    assert after == {step: expected[step] for step in after}
    ref_evals = [e.eval_loss for e in ref_result.metrics.eval_history]
    evals = [e.eval_loss for e in result.metrics.eval_history]
    assert evals == ref_evals
    assert len(evals) == 2
    assert committed_checkpoint_step(store, crashed.job_id, 1) == 8


def test_a_new_attempt_resumes_exactly_from_what_an_earlier_one_committed(
    reference: Reference, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from ray.train import TrainingFailedError

    from swarm_trainer.control import make_control

    expected = reference.losses
    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job_id = "job-cccccccccccccccccccc"

    # Attempt 1 dies for good (no Ray retry) after committing step 4, as on a lost machine.
    first = make_assignment(
        store, tiny_model_dir, job_id=job_id, training=TRAINING, lora=LORA, frame_bytes=FRAME
    )
    with pytest.raises(TrainingFailedError):
        run_job(first, settings, store, max_failures=0, hooks=crash_hooks(tmp_path))
    assert committed_checkpoint_step(store, job_id, 1) == 4

    second = first.model_copy(update={"attempt": 2, "worker_id": "w2"})
    control = make_control()
    result = run_job(second, settings, store, control=control)
    assert result is not None
    messages = drain(control)
    assert resumed_from(messages) == [4]
    after = losses_by_step(messages)
    assert sorted(after) == [5, 6, 7, 8]
    assert after == {step: expected[step] for step in after}
    # Attempt 2 checkpointed into its own run; attempt 1's run is as it left it.
    assert committed_checkpoint_step(store, job_id, 2) == 8
    assert committed_checkpoint_step(store, job_id, 1) == 4


def test_an_attempt_with_another_number_of_workers_is_refused(reference: Reference) -> None:
    """The shares of a streamed dataset depend on the number of ranks: resuming with another
    number would train on other data than the checkpoint's run, so the attempt fails, saying
    why, instead."""
    from ray.train import TrainingFailedError

    first = reference.job
    store = reference.store
    assert committed_checkpoint_step(store, first.job_id, 1) == 8
    spec = first.spec.model_copy(
        update={"resources": first.spec.resources.model_copy(update={"workers": 2})}
    )
    second = first.model_copy(update={"attempt": 2, "worker_id": "w2", "spec": spec})
    with pytest.raises(TrainingFailedError, match="saved by 1 worker and this run has 2"):
        run_job(second, reference.settings, store, max_failures=0)


def test_a_fork_of_the_weights_trains_afresh_from_the_checkpoint_s_adapter(
    reference: Reference, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``from_checkpoint`` without the optimizer: another job, pinned to the reference's
    checkpoint of step 4 as the registry pins it (a copy among its own checkpoints), trains
    from step 0 with a fresh optimizer and schedule, its LoRA weights starting as the
    checkpoint's (a fresh LoRA's B matrices are all zeros)."""
    from safetensors.torch import load_file

    from swarm_contracts.jobs import JobRecord
    from swarm_contracts.registry import ForkCheckpoint
    from swarm_registry.forks import pin
    from swarm_trainer.control import make_control

    expected = reference.losses
    store = reference.store
    fork_id = "job-dddddddddddddddddddd"
    source = JobRecord(
        job_id=reference.job.job_id,
        tenant="default",
        spec=reference.job.spec,
        attempt=1,
    )
    request = ForkCheckpoint(job_id=fork_id, tenant="default", source=f"{reference.job.job_id}@4")
    fork = pin(store, source, 4, request)
    assert (fork.attempt, fork.step, fork.optimizer) == (1, 4, False)
    # One small step: the weights barely move from where they started.
    training = TRAINING | {"max_steps": 1, "lr": 1e-6, "warmup_steps": 0, "eval_every": 1}
    job = make_assignment(
        store, tiny_model_dir, job_id=fork_id, training=training, lora=LORA, frame_bytes=FRAME
    ).model_copy(update={"fork": fork})
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    control = make_control()
    result = run_job(job, settings, store, control=control)
    assert isinstance(result, RunResult)
    messages = drain(control)
    assert resumed_from(messages) == [0]
    # The same first batch as the reference's step 1, on weights four steps further on.
    assert losses_by_step(messages)[1] < expected[1]

    start = load_file(store.root / fork.store_key / "adapter_model.safetensors")
    trained = load_file(store.root / result.adapter_key / "adapter_model.safetensors")
    assert start.keys() == trained.keys()
    b_matrices = [name for name in start if "lora_B" in name]
    assert b_matrices
    for name in b_matrices:
        assert start[name].abs().sum() > 0, name
        assert (trained[name] - start[name]).norm() < 0.01 * start[name].norm(), name

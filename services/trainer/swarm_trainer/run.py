"""One attempt of one job as a Ray Train run (blocking; call it in a thread)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

from swarm_contracts.layout import (
    CHECKPOINTS_KEPT,
    job_checkpoints,
    join_key,
    output_adapter,
    output_replay,
    output_result,
    run_key,
    run_name,
)
from swarm_contracts.verification import ReplayReport
from swarm_contracts.workers import Assignment
from swarm_runtime.store import NotFound, ObjectStore
from swarm_trainer.abort import RegisterController
from swarm_trainer.attempt_trainer import AttemptTrainer, rank_main
from swarm_trainer.cache import CacheSettings
from swarm_trainer.hooks import LoopHooks
from swarm_trainer.loop_config import LoopConfig, StoreConnection
from swarm_trainer.parent_adapter import missing_fork_files, missing_parent_files
from swarm_trainer.resume_point import (
    ResumePoint,
    committed_checkpoint_step,
    prepare_resume,
    replay_start,
    wait_committed,
)
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.train_state import TrainMetrics

__all__ = [
    "committed_checkpoint_step",
    "prepare_resume",
    "replay_start",
    "run_job",
    "starting_point",
    "wait_committed",
]


# Ray restarts a crashed training worker this many times, resuming from the last
# checkpoint, before the attempt fails (the scheduler's requeue covers a lost machine).
DEFAULT_MAX_FAILURES = 1
# Attention implementations that only run on a GPU (see ``swarm_trainer.attention``).
GPU_ATTENTION = ("flash_attention_2", "flex_attention")


class PreflightError(ValueError):
    """The job cannot run at all (missing files, bad spec); no point starting Ray workers."""


@dataclass(frozen=True)
class RunResult:
    adapter_key: str
    metrics: TrainMetrics


def checkpoint_key(job_id: str, attempt: int, dir_name: str) -> str:
    return join_key(run_key(job_id, attempt), dir_name)


def preflight(job: Assignment, store: ObjectStore) -> None:
    """Fail fast, with a reason a user can act on, before any Ray worker starts."""
    model_files = store.list(job.base_model.store_key.rstrip("/") + "/")
    names = {key.rsplit("/", 1)[-1] for key in model_files}
    if "config.json" not in names:
        raise PreflightError(
            f"base model {job.base_model.name}@{job.base_model.version}: no config.json under "
            f"{job.base_model.store_key!r} in the store"
        )
    if not any(n.endswith(".safetensors") for n in names):
        raise PreflightError(
            f"base model {job.base_model.name}@{job.base_model.version}: no .safetensors weights"
        )
    for info in (job.dataset, job.validation):
        if info is not None and not store.exists(info.store_key):
            raise PreflightError(f"dataset {info.id}: {info.store_key!r} missing in the store")
    if job.parent is not None and (missing := missing_parent_files(store, job.parent)):
        raise PreflightError(
            f"from_adapter {job.parent.ref}: {', '.join(missing)} missing in the store"
        )
    if job.fork is not None and (missing := missing_fork_files(store, job.fork)):
        raise PreflightError(
            f"from_checkpoint {job.fork.ref}: {', '.join(missing)} missing in the store"
        )
    preflight_compute(job)


def preflight_compute(job: Assignment) -> None:
    """What the spec asks of the workers' hardware and libraries."""
    resources = job.spec.resources
    if resources.gpus_per_worker == 0 and job.spec.training.precision == "bf16":
        # Honest failure beats silently training in another precision than asked.
        raise PreflightError("precision bf16 needs GPUs (resources.gpus_per_worker > 0)")
    training = job.spec.training
    if resources.gpus_per_worker == 0 and training.attention in GPU_ATTENTION:
        raise PreflightError(
            f"training.attention {training.attention} needs GPUs (resources.gpus_per_worker > 0)"
        )
    if resources.gpus_per_worker == 0 and training.liger == "on":
        raise PreflightError("training.liger on needs GPUs (resources.gpus_per_worker > 0)")
    if resources.strategy == "fsdp" and job.spec.lora.quantize is not None:
        # FSDP2 shards plain tensors; bitsandbytes' packed 4-bit weights are not.
        raise PreflightError(
            f"resources.strategy fsdp cannot shard a lora.quantize {job.spec.lora.quantize} "
            "base: use strategy ddp (QLoRA already fits large bases on one GPU)"
        )
    if job.spec.lora.quantize is not None:
        if resources.gpus_per_worker == 0:
            raise PreflightError(
                f"lora.quantize {job.spec.lora.quantize} needs GPUs (resources.gpus_per_worker > 0)"
            )
        # The agent runs in the Ray workers' environment: without bitsandbytes here, no
        # worker has it (CUDA itself is checked on the worker, where the GPU is).
        if importlib.util.find_spec("bitsandbytes") is None:
            raise PreflightError(
                f"lora.quantize {job.spec.lora.quantize} needs bitsandbytes on the worker "
                "(pip install 'swarm-trainer[qlora]')"
            )


def starting_point(job: Assignment, store: ObjectStore) -> ResumePoint | None:
    """Where the attempt starts: a replay from its target's checkpoint, any other attempt from
    the latest checkpoint an earlier attempt (one it may trust) committed, else a fork with
    ``from_checkpoint_optimizer`` from the checkpoint it forks."""
    if job.verify is not None:
        return replay_start(store, job.verify)
    resume = prepare_resume(store, job.job_id, job.attempt, after=job.resume_after_attempt)
    if resume is None and job.fork is not None and job.fork.optimizer:
        # A fork that takes the whole training state continues the source's run from its
        # checkpoint (the registry's copy among this job's own), as a resume would.
        return ResumePoint(step=job.fork.step, key=job.fork.store_key)
    return resume


def run_job(
    job: Assignment,
    settings: TrainerSettings,
    store: ObjectStore,
    control: Any = None,
    max_failures: int = DEFAULT_MAX_FAILURES,
    hooks: LoopHooks | None = None,
    resume: ResumePoint | None = None,
) -> RunResult | ReplayReport | None:
    """Train ``job`` to the end; None when it was cancelled (``control`` said so). A replay
    (``job.verify``) answers with what it measured instead.

    ``control``: the run's ``control.JobControl`` (reports out, cancel in). ``resume``: what
    ``starting_point`` answered for this attempt (looked up when not given). ``hooks``: test
    instrumentation for the loop (see ``swarm_trainer.hooks``)."""
    preflight(job, store)
    resources = job.spec.resources
    if resume is None:
        resume = starting_point(job, store)
    resume_from = None
    if resume is not None:
        # Ray Train v2 dropped TorchTrainer(resume_from_checkpoint=...): the loop takes it from
        # its config when its own run has no checkpoint yet (a retry resumes from the latter).
        path, fs = store.ray_storage(resume.key)
        resume_from = Checkpoint(path=path, filesystem=fs)
    storage_path, storage_fs = store.ray_storage(job_checkpoints(job.job_id))
    work_dir = Path(settings.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    config = LoopConfig(
        assignment=job,
        store=StoreConnection.of(settings, store),
        work_dir=work_dir,
        cache=CacheSettings.of(settings),
        resume_from=resume_from,
        control=control,
        hooks=hooks or LoopHooks(),
    )
    trainer = AttemptTrainer(
        rank_main,
        train_loop_config=config.for_ray(),
        scaling_config=ScalingConfig(
            num_workers=resources.workers,
            use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker={
                "CPU": resources.cpus_per_worker,
                **({"GPU": resources.gpus_per_worker} if resources.gpus_per_worker else {}),
            },
        ),
        run_config=RunConfig(
            # One run per attempt (see layout.run_key); Ray's own retries within it
            # resume from its latest checkpoint.
            name=run_name(job.attempt),
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=max_failures),
            # The job record keeps the same number of steps (JobRecord.checkpoints): a replay
            # starts and ends at checkpoints that still exist.
            checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            # The controller registers with ``control``, which can then abort the run.
            callbacks=[RegisterController(control)] if control is not None else None,
        ),
    )
    trainer.fit()
    if job.verify is not None:
        try:
            return ReplayReport.model_validate_json(
                store.get_bytes(output_replay(job.job_id, job.attempt))
            )
        except NotFound:
            return None
    try:
        metrics = TrainMetrics.model_validate_json(
            store.get_bytes(output_result(job.job_id, job.attempt))
        )
    except NotFound:
        # The loop only returns without a result when it stopped for a cancel.
        return None
    return RunResult(adapter_key=output_adapter(job.job_id, job.attempt), metrics=metrics)

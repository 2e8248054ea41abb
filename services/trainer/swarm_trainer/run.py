"""One attempt of one job as a Ray Train ``TorchTrainer`` run (blocking; call it in a thread)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from swarm_common.settings import Settings
from swarm_common.store import NotFound, ObjectStore, join_key
from swarm_common.workers import Assignment
from swarm_trainer.checkpoint import (
    ResumePoint,
    committed_checkpoint_step,
    prepare_resume,
    run_key,
    run_name,
    wait_committed,
)
from swarm_trainer.parent_adapter import missing_parent_files
from swarm_trainer.recipe import RESULT_FILE, output_prefix, train_loop

__all__ = ["committed_checkpoint_step", "prepare_resume", "run_job", "wait_committed"]


# Ray restarts a crashed training worker this many times, resuming from the last
# checkpoint, before the attempt fails (the scheduler's requeue covers a lost machine).
DEFAULT_MAX_FAILURES = 1


class PreflightError(ValueError):
    """The job cannot run at all (missing files, bad spec); no point starting Ray workers."""


@dataclass(frozen=True)
class RunResult:
    adapter_key: str
    metrics: dict[str, Any]


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
    resources = job.spec.resources
    if resources.gpus_per_worker == 0 and job.spec.training.precision == "bf16":
        # Honest failure beats silently training in another precision than asked.
        raise PreflightError("precision bf16 needs GPUs (resources.gpus_per_worker > 0)")


def store_config(settings: Settings) -> dict[str, Any]:
    secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
    return {
        "url": settings.store_url,
        "access_key": settings.s3_access_key,
        "secret_key": secret,
        "region": settings.s3_region,
    }


def run_job(
    job: Assignment,
    settings: Settings,
    store: ObjectStore,
    progress: Any | None = None,
    control: Any | None = None,
    max_failures: int = DEFAULT_MAX_FAILURES,
    hooks: dict[str, Any] | None = None,
    resume: ResumePoint | None = None,
) -> RunResult | None:
    """Train ``job`` to the end; None when it was cancelled (``control`` said so).

    ``resume``: what ``prepare_resume`` answered for this attempt (looked up when not given).
    ``hooks`` is test-only instrumentation for the loop (see ``recipe.crash_hook``)."""
    preflight(job, store)
    resources = job.spec.resources
    if resume is None:
        resume = prepare_resume(store, job.job_id, job.attempt)
    resume_from = None
    if resume is not None:
        # Ray Train v2 dropped TorchTrainer(resume_from_checkpoint=...): the loop takes it from
        # its config when its own run has no checkpoint yet (a retry resumes from the latter).
        path, fs = store.ray_storage(resume.key)
        resume_from = Checkpoint(path=path, filesystem=fs)
    storage_path, storage_fs = store.ray_storage(join_key("checkpoints", job.job_id))
    work_dir = Path(settings.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "assignment": job.model_dump(mode="json"),
            "store": store_config(settings),
            "progress": progress,
            "control": control,
            "work_dir": str(work_dir),
            "hooks": hooks or {},
            "resume_from": resume_from,
        },
        scaling_config=ScalingConfig(
            num_workers=resources.workers,
            use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker={
                "CPU": resources.cpus_per_worker,
                **({"GPU": resources.gpus_per_worker} if resources.gpus_per_worker else {}),
            },
        ),
        run_config=RunConfig(
            # One run per attempt (see checkpoint.run_key); Ray's own retries within it
            # resume from its latest checkpoint.
            name=run_name(job.attempt),
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    trainer.fit()
    prefix = output_prefix(job.job_id, job.attempt)
    try:
        metrics = json.loads(store.get_bytes(join_key(prefix, RESULT_FILE)))
    except NotFound:
        # The loop only returns without a result when it stopped for a cancel.
        return None
    return RunResult(adapter_key=join_key(prefix, "adapter"), metrics=metrics)

"""One attempt of one job as a Ray Train ``TorchTrainer`` run (blocking; call it in a thread)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from swarm_common.settings import Settings
from swarm_common.store import NotFound, ObjectStore, join_key
from swarm_common.workers import Assignment
from swarm_trainer.checkpoint import committed_checkpoint_step
from swarm_trainer.recipe import RESULT_FILE, output_prefix, train_loop

__all__ = ["committed_checkpoint_step", "run_job"]


# Ray restarts a crashed training worker this many times, resuming from the last
# checkpoint, before the attempt fails (the scheduler's requeue covers a lost machine).
DEFAULT_MAX_FAILURES = 1


class PreflightError(ValueError):
    """The job cannot run at all (missing files, bad spec); no point starting Ray workers."""


@dataclass(frozen=True)
class RunResult:
    adapter_key: str
    metrics: dict[str, Any]


def checkpoint_key(job_id: str, dir_name: str) -> str:
    return join_key("checkpoints", job_id, dir_name)


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
) -> RunResult | None:
    """Train ``job`` to the end; None when it was cancelled (``control`` said so).

    ``hooks`` is test-only instrumentation for the loop (see ``recipe.crash_hook``)."""
    preflight(job, store)
    resources = job.spec.resources
    storage_path, storage_fs = store.ray_storage("checkpoints")
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
            # One run name per job, across attempts: a new attempt finds the previous one's
            # checkpoints in the same place and resumes from the latest.
            name=job.job_id,
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

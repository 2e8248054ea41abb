"""A Swarm job seen as an OpenAI ``fine_tuning.job`` (``openai.types.fine_tuning``).

The states map one to one but for ``assigned`` (placed on a worker that is loading the
model: ``running``) and a job the scheduler has not recorded yet (``validating_files``); a
running job being paused is ``running`` until its worker has handed it back.
``fine_tuned_model`` is the adapter the job registered, as ``name@version``: what
``/v1/chat/completions`` takes as ``model`` at once.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from swarm_contracts.jobs import JobRecord, JobSpec, JobState, TrainingSpec
from swarm_contracts.methods import DpoMethod
from swarm_gateway.fine_tune_records import (
    FineTune,
    Hyperparameters,
    file_id,
    ftjob_id,
    results_file_id,
)

Status = Literal[
    "validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled"
]
STATUS_OF_STATE: dict[JobState, Status] = {
    JobState.queued: "queued",
    JobState.assigned: "running",
    JobState.running: "running",
    JobState.paused: "paused",
    JobState.succeeded: "succeeded",
    JobState.failed: "failed",
    JobState.cancelled: "cancelled",
}
# The learning rate a multiplier of 1 stands for: Swarm's default (TrainingSpec.lr).
BASE_LR: float = TrainingSpec.model_fields["lr"].default


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class SupervisedMethod(BaseModel):
    hyperparameters: Hyperparameters


class DpoHyperparameters(Hyperparameters):
    beta: float


class DpoMethodView(BaseModel):
    hyperparameters: DpoHyperparameters


class Method(BaseModel):
    type: Literal["supervised", "dpo"] = "supervised"
    supervised: SupervisedMethod | None = None
    dpo: DpoMethodView | None = None


def method_of(spec: JobSpec, hyper: Hyperparameters) -> Method:
    """OpenAI's ``method`` of a job: its Swarm method, with the hyperparameters."""
    if isinstance(spec.method, DpoMethod):
        dpo = DpoHyperparameters(**hyper.model_dump(), beta=spec.method.beta)
        return Method(type="dpo", dpo=DpoMethodView(hyperparameters=dpo))
    return Method(supervised=SupervisedMethod(hyperparameters=hyper))


class FineTuningJob(BaseModel):
    """OpenAI's ``fine_tuning.job``, with ``swarm_job_id`` (the Swarm job it is) beside."""

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None = None
    fine_tuned_model: str | None = None
    finished_at: int | None = None
    hyperparameters: Hyperparameters
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: Status
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    method: Method
    swarm_job_id: str


def status_of(state: JobState) -> Status:
    """OpenAI's status of a Swarm state; a state this view does not know (one Swarm may gain)
    is shown as waiting, never a 500."""
    return STATUS_OF_STATE.get(state, "queued")


def _ts(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def derived_hyperparameters(record: JobRecord, examples: int | None) -> Hyperparameters:
    """A Swarm job's settings in OpenAI's terms (a job submitted without the OpenAI API):
    epochs from its steps and the training set's size, when known."""
    t = record.spec.training
    per_step = t.batch_size * t.grad_accum
    epochs = max(1, round(t.max_steps * per_step / examples)) if examples else 1
    return Hyperparameters(
        n_epochs=epochs,
        batch_size=per_step,
        learning_rate_multiplier=t.lr / BASE_LR,
    )


def estimated_finish(record: JobRecord) -> int | None:
    """When a running job should end, at its pace so far (steps since it was placed)."""
    step = int(record.metrics.get("step", 0))
    if record.state != JobState.running or step <= 0 or record.assigned_at is None:
        return None
    per_step = (record.updated_at - record.assigned_at).total_seconds() / step
    remaining = max(0, record.spec.training.max_steps - step) * per_step
    return math.ceil(record.updated_at.timestamp() + remaining)


def job_error(record: JobRecord) -> JobError | None:
    if record.state != JobState.failed:
        return None
    reason = record.reason or "the job failed"
    lowered = reason.lower()
    # The trainer's and scheduler's reasons about the data name a dataset (DatasetError:
    # ..., "dataset ds-... not found"): OpenAI's error says which file.
    if "dataset" not in lowered:
        return JobError(code="job_failed", message=reason)
    if "validation" in lowered:
        return JobError(code="invalid_validation_file", message=reason, param="validation_file")
    return JobError(code="invalid_training_file", message=reason, param="training_file")


def view(
    record: JobRecord,
    extras: FineTune | None,
    *,
    examples: int | None = None,
    trained_tokens: int | None = None,
    pending: bool = False,
) -> FineTuningJob:
    """The OpenAI view of ``record``; ``pending``: the scheduler has not recorded it yet."""
    spec = record.spec
    hyper = (
        extras.hyperparameters if extras is not None else derived_hyperparameters(record, examples)
    )
    state = record.state
    adapter = record.adapter
    return FineTuningJob(
        id=ftjob_id(record.job_id),
        created_at=_ts(record.created_at) or 0,
        error=job_error(record),
        fine_tuned_model=f"{adapter.name}@{adapter.version}" if adapter is not None else None,
        finished_at=_ts(record.updated_at) if state.terminal else None,
        hyperparameters=hyper,
        model=extras.model if extras is not None else spec.base_model,
        organization_id=record.tenant,
        result_files=[results_file_id(record.job_id)] if state == JobState.succeeded else [],
        seed=spec.training.seed,
        status="validating_files" if pending else status_of(state),
        trained_tokens=trained_tokens if state.terminal else None,
        training_file=file_id(spec.dataset),
        validation_file=file_id(spec.validation) if spec.validation else None,
        estimated_finish=estimated_finish(record),
        metadata=extras.metadata if extras is not None else None,
        method=method_of(spec, hyper),
        swarm_job_id=record.job_id,
    )

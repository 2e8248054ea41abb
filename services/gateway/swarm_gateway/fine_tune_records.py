"""What an OpenAI fine-tuning job adds to the Swarm job it is a view of.

One record per job created through ``POST /v1/fine_tuning/jobs``, in the gateway's own KV
bucket ``openai_jobs`` (key: the Swarm job id), written before the job is submitted. The job
itself (state, events, checkpoints, adapter) is the Swarm job's; this keeps only what Swarm's
job spec has no room for: the OpenAI ``metadata``, the ``suffix``, the ``model`` as the caller
named it and the hyperparameters in OpenAI's terms, with every ``"auto"`` resolved. A Swarm
job submitted otherwise has no such record, and its OpenAI view derives them from its spec.

The ids are Swarm's, re-prefixed: a file is a dataset (``file-<hex>`` is ``ds-<hex>``), a
fine-tuning job a job (``ftjob-<hex>`` is ``job-<hex>``), so no lookup table is needed.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from swarm_contracts.jobs import JobSpec, utcnow

FILE_PREFIX, DATASET_PREFIX = "file-", "ds-"
FTJOB_PREFIX, JOB_PREFIX = "ftjob-", "job-"
# A job's metrics CSV (``result_files``): made from the job's metrics when it is read.
RESULTS_PREFIX = "file-results-"


def file_id(dataset_id: str) -> str:
    return FILE_PREFIX + dataset_id.removeprefix(DATASET_PREFIX)


def dataset_id(file_id: str) -> str | None:
    """The dataset a ``file-<hex>`` id names (None: not a dataset's id)."""
    if not file_id.startswith(FILE_PREFIX) or file_id.startswith(RESULTS_PREFIX):
        return None
    return DATASET_PREFIX + file_id.removeprefix(FILE_PREFIX)


def ftjob_id(job_id: str) -> str:
    return FTJOB_PREFIX + job_id.removeprefix(JOB_PREFIX)


def job_id(ftjob_id: str) -> str | None:
    """The Swarm job an ``ftjob-<hex>`` id (or a Swarm ``job-<hex>`` id) names."""
    if ftjob_id.startswith(FTJOB_PREFIX):
        return JOB_PREFIX + ftjob_id.removeprefix(FTJOB_PREFIX)
    return ftjob_id if ftjob_id.startswith(JOB_PREFIX) else None


def results_file_id(job_id: str) -> str:
    return RESULTS_PREFIX + job_id.removeprefix(JOB_PREFIX)


def results_job_id(file_id: str) -> str | None:
    if not file_id.startswith(RESULTS_PREFIX):
        return None
    return JOB_PREFIX + file_id.removeprefix(RESULTS_PREFIX)


class Hyperparameters(BaseModel):
    """OpenAI's supervised hyperparameters, resolved (no ``"auto"`` left)."""

    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float


class FineTune(BaseModel):
    job_id: str
    tenant: str
    model: str = Field(description="as the caller named it")
    suffix: str | None = None
    metadata: dict[str, str] | None = None
    hyperparameters: Hyperparameters
    # The spec submitted: the job's view until the scheduler has recorded the job.
    spec: JobSpec
    created_at: datetime = Field(default_factory=utcnow)

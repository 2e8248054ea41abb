"""Per-job metric series as the telemetry service keeps and serves them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from swarm_contracts.replies import Action


class TrainPoint(BaseModel):
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    attempt: int = 0


class EvalPoint(BaseModel):
    step: int
    eval_loss: float
    perplexity: float
    attempt: int = 0
    # The task evals' metrics at this step (``exact_match``...), for a job with ``evals``.
    task: dict[str, float] = Field(default_factory=dict)


class JobMetrics(BaseModel):
    job_id: str
    train: list[TrainPoint] = Field(default_factory=list)
    eval: list[EvalPoint] = Field(default_factory=list)


class GetJobMetrics(BaseModel):
    """Request on ``swarm.telemetry.metrics.get``; replied with ``Reply[JobMetrics]``."""

    job_id: str
    max_points: int | None = Field(default=None, ge=2, description="downsample to at most this")


GET_JOB_METRICS = Action("metrics.get", GetJobMetrics, JobMetrics)
"""Asked on ``swarm.telemetry.metrics.get`` (``Subjects.telemetry``)."""

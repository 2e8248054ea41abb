"""``data`` payloads of the job events on ``swarm.jobs.<job_id>.events.<event>`` (contract).

Every event carries the job id and the attempt it belongs to; the scheduler drops events from
any attempt but the current one, which fences out a worker that lost its lease.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

from swarm_contracts.evals import EvalResult
from swarm_contracts.jobs import AdapterRef, JobSpec
from swarm_contracts.methods import PreferenceMetrics
from swarm_contracts.verification import ReplayReport, VerifyPolicy

EventName = Literal[
    "queued",
    "assigned",
    "started",
    "progress",
    "checkpoint",
    "validated",
    "requeued",
    "released",
    "succeeded",
    "failed",
    "cancelled",
    "replayed",
    "verified",
]
JOB_EVENTS: tuple[str, ...] = get_args(EventName)
# ``replayed`` ends a replay job (it registers no adapter, so it never ``succeeded``).
TERMINAL_EVENTS = ("succeeded", "failed", "cancelled", "replayed")


class JobEvent(BaseModel):
    event: EventName
    job_id: str
    attempt: int = 0


class Queued(JobEvent):
    event: Literal["queued"] = "queued"
    tenant: str
    spec: JobSpec
    reason: str | None = Field(default=None, description="why it is still waiting, if it is")


class Assigned(JobEvent):
    event: Literal["assigned"] = "assigned"
    worker_id: str


class Started(JobEvent):
    event: Literal["started"] = "started"
    worker_id: str
    resumed_from_step: int = 0


class Progress(JobEvent):
    event: Literal["progress"] = "progress"
    step: int
    max_steps: int
    loss: float
    lr: float
    tokens_per_s: float
    elapsed_s: float = 0.0
    # Tokens the step trained on, all ranks together (None from a trainer that did not count):
    # what an OpenAI fine-tuning job reports as ``trained_tokens``.
    tokens: int | None = None
    # A DPO job's rewards over the step's pairs (rank 0's); None for SFT.
    preference: PreferenceMetrics | None = None


class CheckpointSaved(JobEvent):
    event: Literal["checkpoint"] = "checkpoint"
    step: int
    store_key: str


class Validated(JobEvent):
    event: Literal["validated"] = "validated"
    step: int
    eval_loss: float
    perplexity: float
    # The task evals' metrics and sample at this step, for a job with ``evals``.
    evals: EvalResult | None = None
    # A DPO job's rewards over every validation pair (then ``eval_loss`` is the DPO loss and
    # ``perplexity`` the chosen answers'); None for SFT.
    preference: PreferenceMetrics | None = None


class Requeued(JobEvent):
    event: Literal["requeued"] = "requeued"
    reason: str


class Released(JobEvent):
    """The worker stopped the attempt on purpose (it shuts down, or is drained with
    ``move_jobs``) after committing a checkpoint, and hands the job back: the scheduler requeues
    it at once, and the next attempt resumes from ``last_checkpoint_step``.

    ``fault``: the worker could not go on for a reason of its own, not the job's (its object
    store unreachable); the requeue then counts against ``max_attempts`` like a lost worker."""

    event: Literal["released"] = "released"
    worker_id: str
    reason: str
    last_checkpoint_step: int | None = None
    fault: bool = False


class Succeeded(JobEvent):
    event: Literal["succeeded"] = "succeeded"
    adapter: AdapterRef
    metrics: dict[str, float] = Field(default_factory=dict)
    # The attempt's committed checkpoints (steps) as its worker saw them commit: the record's
    # list, which the ``checkpointed`` events build, may miss one whose event is applied
    # after this one (a replay must start from a checkpoint that is still there).
    checkpoints: list[int] = Field(default_factory=list)


class Failed(JobEvent):
    event: Literal["failed"] = "failed"
    reason: str


class Cancelled(JobEvent):
    event: Literal["cancelled"] = "cancelled"
    reason: str = "cancelled by request"
    last_checkpoint_step: int | None = None


class Replayed(JobEvent):
    """A replay job's end (its worker's word): what replaying the target's steps measured."""

    event: Literal["replayed"] = "replayed"
    worker_id: str
    report: ReplayReport


class Verified(JobEvent):
    """On the replayed job (the scheduler's word): whether its replay on another worker matched.

    ``outcome`` failed: the weights or losses differ beyond the tolerances; ``worker_id`` is
    then marked suspect, and ``action`` says what became of the job. ``error``: the replay
    itself could not be done (``reason``), which says nothing about the worker."""

    event: Literal["verified"] = "verified"
    outcome: Literal["passed", "failed", "error"]
    reason: str = ""
    replay_job_id: str
    worker_id: str = Field(description="the worker whose training was replayed")
    replay_worker_id: str | None = None
    from_step: int
    to_step: int
    max_relative_l2: float | None = None
    worst_matrix: str | None = None
    max_loss_difference: float | None = Field(
        default=None, description="largest |replayed - reported| / |reported| over the steps"
    )
    tolerance: float
    loss_tolerance: float
    replayed_steps: int
    job_steps: int
    overhead: float = Field(description="replayed steps ÷ job steps")
    action: Literal["none", "failed", "rerun"] = "none"
    policy: VerifyPolicy


AnyJobEvent = (
    Queued
    | Assigned
    | Started
    | Progress
    | CheckpointSaved
    | Validated
    | Requeued
    | Released
    | Succeeded
    | Failed
    | Cancelled
    | Replayed
    | Verified
)


class CancelRequest(BaseModel):
    """``data`` of a message on ``swarm.jobs.<job_id>.cancel``."""

    job_id: str
    reason: str = "cancelled by request"

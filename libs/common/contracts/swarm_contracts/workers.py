"""Worker heartbeats and job assignments (contract)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import (
    ForkPoint,
    JobRecord,
    JobSpec,
    JobState,
    ModelRef,
    ParentAdapter,
    utcnow,
)
from swarm_contracts.replies import Action
from swarm_contracts.sessions import HeldSession
from swarm_contracts.verification import VerifyTarget


class Gpu(BaseModel):
    index: int
    name: str
    memory_bytes: int


class Resources(BaseModel):
    cpus: int
    memory_bytes: int
    gpus: list[Gpu] = Field(default_factory=list)


class RunningJob(BaseModel):
    job_id: str
    attempt: int
    step: int = 0


# A worker's own word on itself: ``starting`` from the moment its process is up until it can
# take jobs (Ray, the self-benchmark): a starting process runs nothing, so any job the records
# still give the worker was lost with its previous process; ``leaving`` while it shuts down (it
# takes no new jobs and hands its running ones back from a checkpoint), ``gone`` in its last
# heartbeat (it has stopped).
HeartbeatState = Literal["starting", "alive", "leaving", "gone"]
# A heartbeat names at most this many cached base models (the most recently used), to stay small.
CACHED_MODELS_MAX = 32
# Sessions one heartbeat may list: a worker's session lane holds far fewer; a heartbeat listing
# more is refused whole, so no sender makes the scheduler walk an unbounded list.
SESSIONS_LISTED_MAX = 1024


class WorkerBenchmark(BaseModel):
    """A worker's measured speed: its self-benchmark when it starts, and again on request
    (``swarm.workers.<worker_id>.benchmark``). Placement can prefer faster workers, and the
    scheduler flags a worker measuring far below what it advertises."""

    matmul_tflops: float = Field(
        description="dense square matmuls on its first GPU (bf16, fp16 where the GPU has no "
        "bf16) or on its CPUs (fp32), in TFLOP/s"
    )
    train_tokens_per_s: float = Field(
        description="LoRA training steps (forward, backward, AdamW) of a tiny Llama, tokens/s"
    )
    device: str = Field(description='what it measured: "cuda:0 NVIDIA H100 80GB HBM3", "cpu"')
    dtype: str = Field(description="bfloat16, float16 or float32")
    busy: bool = Field(
        default=False,
        description="jobs were running on the worker while it measured (a shared device "
        "measures low): not used to flag the worker",
    )
    duration_s: float = Field(description="how long the measurement took")
    measured_at: datetime = Field(default_factory=utcnow)


class BenchmarkRequest(BaseModel):
    """Request of ``swarm.workers.<worker_id>.benchmark``: measure again now. Answered with
    ``Reply[WorkerBenchmark]``; the worker's heartbeats carry the new result from then on."""

    worker_id: str


BENCHMARK = Action("benchmark", BenchmarkRequest, WorkerBenchmark)
"""Asked on the worker's own ``swarm.workers.<worker_id>.benchmark`` (``Subjects.benchmark``)."""


class Heartbeat(BaseModel):
    """``data`` of ``swarm.workers.<worker_id>.heartbeat``, sent every few seconds."""

    worker_id: str
    resources: Resources
    free: Resources
    running: list[RunningJob] = Field(default_factory=list)
    sessions: list[HeldSession] = Field(
        default_factory=list,
        max_length=SESSIONS_LISTED_MAX,
        description="the training sessions it holds: renews their leases",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    time: datetime = Field(default_factory=utcnow)
    state: HeartbeatState = "alive"
    # The latest self-benchmark (absent until the first one is done, or when it is turned off).
    benchmark: WorkerBenchmark | None = None
    # The dense TFLOP/s its provider promises (SWARM_ADVERTISED_TFLOPS); without it, what its
    # GPU model should reach. A benchmark far below it flags the worker ``slow``.
    advertised_tflops: float | None = None
    cached_models: list[str] = Field(
        default_factory=list,
        max_length=CACHED_MODELS_MAX,
        description="digests (ModelRef.digest) of the base models in the worker's cache, most "
        "recently used first: placement prefers a worker holding the job's base model",
    )
    # The provider whose credentials the agent joined with (``swarm-trainer join``); a
    # provider's worker id is its provider name, and its NATS user may publish only this
    # worker's heartbeats, so the name cannot be claimed by anyone else.
    provider: str | None = None

    @model_validator(mode="after")
    def _provider_is_worker(self) -> Heartbeat:
        if self.provider is not None and self.provider != self.worker_id:
            raise ValueError("a provider's worker id is its provider name")
        return self


class Assignment(BaseModel):
    """``data`` of ``swarm.workers.<worker_id>.assign``: run this attempt of this job."""

    job_id: str
    attempt: int
    tenant: str
    worker_id: str
    spec: JobSpec
    base_model: ModelRef
    dataset: DatasetInfo
    validation: DatasetInfo | None = None
    # ``spec.evals.dataset``, pinned like the others.
    eval_dataset: DatasetInfo | None = None
    # Set when the job continues training an adapter (``spec.from_adapter``), pinned.
    parent: ParentAdapter | None = None
    # Set when the job starts from another job's checkpoint (``spec.from_checkpoint``), pinned.
    fork: ForkPoint | None = None
    # W3C traceparent of the placement span: the trainer's spans for this attempt are its children.
    trace_parent: str | None = None
    # A secret for this attempt only: the worker sends it with every event of the attempt
    # (header ``swarm_contracts.providers.ATTEMPT_TOKEN_HEADER``), and the scheduler applies
    # only events that carry it, so that no other worker can report on this job.
    attempt_token: str | None = Field(default=None, repr=False)
    # A replay (swarm_contracts.verification): train only these steps of that job, from its
    # checkpoint, compare, and register nothing.
    verify: VerifyTarget | None = None
    # Resume only from checkpoints of attempts after this one (JobRecord.resume_after_attempt).
    resume_after_attempt: int = 0


class AttemptQuery(BaseModel):
    """``swarm.workers.<worker_id>.attempt`` (request/reply to the scheduler): does this worker
    still hold this attempt? A worker reads no job records itself (a provider may not)."""

    job_id: str
    attempt: int


class AttemptStatus(BaseModel):
    """The scheduler's answer to ``AttemptQuery``. Of a job the asker does not hold it says
    only that, never who does or what the job is."""

    job_id: str
    attempt: int
    # The job's current attempt is this one, on the asking worker, assigned or running.
    holds: bool
    # The record's state, when ``holds`` (assigned or running); else None.
    state: JobState | None = None
    cancel_requested: bool = False
    # The job is to be paused: checkpoint it and hand it back (as for a ``ReleaseRequest``).
    release_requested: bool = False

    @classmethod
    def of(cls, record: JobRecord | None, query: AttemptQuery, worker_id: str) -> AttemptStatus:
        """What ``record`` (None: no such job) says to ``worker_id`` about ``query``."""
        holds = (
            record is not None
            and record.attempt == query.attempt
            and record.worker_id == worker_id
            and record.state in (JobState.assigned, JobState.running)
        )
        if record is None or not holds:
            return cls(job_id=query.job_id, attempt=query.attempt, holds=False)
        return cls(
            job_id=query.job_id,
            attempt=query.attempt,
            holds=True,
            state=record.state,
            cancel_requested=record.cancel_requested,
            release_requested=record.pause_requested,
        )


ATTEMPT = Action("attempt", AttemptQuery, AttemptStatus)
"""Asked on the worker's own ``swarm.workers.<worker_id>.attempt`` (``Subjects.worker_attempt``),
answered by the scheduler."""


class WorkerInfo(BaseModel):
    """The scheduler's view of a worker, kept in the ``workers`` KV bucket for the gateway."""

    worker_id: str
    state: str = Field(description="starting | alive | leaving | lost | gone")
    resources: Resources
    free: Resources
    running: list[RunningJob] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    last_heartbeat: datetime
    cached_models: list[str] = Field(
        default_factory=list, description="from the heartbeat: base models in its cache"
    )
    provider: str | None = None
    # From the operator's ``WorkerOps``: no new jobs (cordoned), and expected to empty (draining).
    cordoned: bool = False
    draining: bool = False
    # A replay of its work did not match (``WorkerOps.suspect``): no new jobs until cleared.
    suspect: bool = False
    benchmark: WorkerBenchmark | None = None
    advertised_tflops: float | None = None
    flags: list[str] = Field(
        default_factory=list,
        description="what the scheduler noticed: slow (its benchmark is far below what it "
        "advertises)",
    )


class WorkerOps(BaseModel):
    """An operator's standing instruction for one worker: the ``worker_ops`` KV bucket, key =
    worker id, written by the gateway (``/v1/workers/{id}/cordon|uncordon|drain``) and followed
    by the scheduler, so that it outlives any scheduler process. No entry: schedulable."""

    worker_id: str
    cordoned: bool = Field(default=False, description="no new jobs are placed on the worker")
    drain: bool = Field(default=False, description="cordoned, and expected to empty")
    move_jobs: bool = Field(
        default=False,
        description="with drain: running jobs are checkpointed and moved to other workers now, "
        "rather than left to finish",
    )
    reason: str = ""
    suspect: bool = Field(
        default=False,
        description="set by the scheduler when a replay of the worker's training did not "
        "match: no new jobs until an operator clears it (``/v1/workers/{id}/clear``)",
    )
    suspect_reason: str = ""
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def schedulable(self) -> bool:
        return not (self.cordoned or self.drain or self.suspect)


class ReleaseRequest(BaseModel):
    """``data`` of ``swarm.workers.<worker_id>.release``: checkpoint these jobs and hand them
    back (each answered by a ``released`` job event). Sent by the scheduler while it drains
    the worker with ``move_jobs``, or for a job paused by request, again every few seconds
    while the jobs are still there."""

    worker_id: str
    job_ids: list[str]
    reason: str = "worker drained"


def parse_labels(text: str) -> dict[str, str]:
    """``"provider=acme,region=eu"`` → ``{"provider": "acme", "region": "eu"}``.

    Blank items are skipped; an item without ``=`` is an error, because a silently dropped label
    would make jobs that require it wait for ever without saying why.
    """
    labels: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"worker label {item!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels

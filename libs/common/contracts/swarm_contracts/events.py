"""``data`` payloads of the job events on ``swarm.jobs.<job_id>.events.<event>`` (contract).

Every event carries the job id and the attempt it belongs to; the scheduler drops events from
any attempt but the current one, which fences out a worker that lost its lease.

What an event *means* is on its class, beside its fields (``meaning``): who may send it, and
the job state it leaves the job in (which says whether it ends the job). Every set of event
names the services act on (the final events, the scheduler's own, the job state an event
leads to) is derived from it, here or where it is used; adding an event is adding its class,
with its meaning, to ``AnyJobEvent``. ``tests/contracts/test_event_meaning.py`` checks that
every event class has one.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field

from swarm_contracts.evals import EvalResult
from swarm_contracts.jobs import AdapterRef, JobSpec, JobState
from swarm_contracts.methods import PreferenceMetrics
from swarm_contracts.verification import ReplayReport, VerifyPolicy

# Who sends a job event: the scheduler itself, or the worker running the attempt (a trainer
# agent, whose events the scheduler checks and republishes).
Origin = Literal["scheduler", "worker"]


class EventMeaning(BaseModel):
    """What a job event means beyond its fields."""

    model_config = ConfigDict(frozen=True)

    origin: tuple[Origin, ...] = Field(description="who may send it")
    state_after: JobState | None = Field(
        description="the job's state once it is applied; None: it leaves the state as it was"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def terminal(self) -> bool:
        """Whether it ends the job: it leaves the job in a final state."""
        return self.state_after is not None and self.state_after.terminal


def sent_by(*origin: Origin, leaves: JobState | None) -> EventMeaning:
    """The meaning of an event ``origin`` sends, which ``leaves`` the job in that state."""
    return EventMeaning(origin=origin, state_after=leaves)


class JobEvent(BaseModel):
    # Each event class narrows it to its own name (a Literal: the discriminator of AnyJobEvent).
    event: str
    job_id: str
    attempt: int = 0

    meaning: ClassVar[EventMeaning]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "meaning" not in cls.__dict__:
            raise TypeError(f"job event {cls.__name__} must say what it means (``meaning``)")

    @classmethod
    def name(cls) -> str:
        """The event's name: its ``event`` field, its subject's last token."""
        default = cls.model_fields["event"].default
        assert isinstance(default, str), f"{cls.__name__} names no event"
        return default


class Queued(JobEvent):
    event: Literal["queued"] = "queued"
    meaning = sent_by("scheduler", leaves=JobState.queued)
    tenant: str
    spec: JobSpec
    reason: str | None = Field(default=None, description="why it is still waiting, if it is")


class Assigned(JobEvent):
    event: Literal["assigned"] = "assigned"
    meaning = sent_by("scheduler", leaves=JobState.assigned)
    worker_id: str


class Started(JobEvent):
    event: Literal["started"] = "started"
    meaning = sent_by("worker", leaves=JobState.running)
    worker_id: str
    resumed_from_step: int = 0


class Progress(JobEvent):
    event: Literal["progress"] = "progress"
    meaning = sent_by("worker", leaves=JobState.running)
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
    meaning = sent_by("worker", leaves=JobState.running)
    step: int
    store_key: str


class Validated(JobEvent):
    event: Literal["validated"] = "validated"
    meaning = sent_by("worker", leaves=JobState.running)
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
    meaning = sent_by("scheduler", leaves=JobState.queued)
    reason: str


class Released(JobEvent):
    """The worker stopped the attempt on purpose (it shuts down, or is drained with
    ``move_jobs``) after committing a checkpoint, and hands the job back: the scheduler requeues
    it at once, and the next attempt resumes from ``last_checkpoint_step``.

    ``fault``: the worker could not go on for a reason of its own, not the job's (its object
    store unreachable); the requeue then counts against ``max_attempts`` like a lost worker."""

    event: Literal["released"] = "released"
    # The scheduler's ``requeued`` (or ``failed``, ``cancelled``) that follows moves the job.
    meaning = sent_by("worker", leaves=None)
    worker_id: str
    reason: str
    last_checkpoint_step: int | None = None
    fault: bool = False


class Paused(JobEvent):
    """The job is paused (the scheduler's word): its worker checkpointed it and handed it back
    on a pause request (``released`` comes just before), or it lost its worker while pausing.
    It holds no worker, lease or capacity until it is resumed; ``last_checkpoint_step`` is
    where a resume starts (None: the worker had committed none)."""

    event: Literal["paused"] = "paused"
    meaning = sent_by("scheduler", leaves=JobState.paused)
    reason: str
    last_checkpoint_step: int | None = None


class Resumed(JobEvent):
    """A paused job is queued again (the scheduler's word); its next attempt resumes from the
    latest checkpoint an earlier attempt committed."""

    event: Literal["resumed"] = "resumed"
    meaning = sent_by("scheduler", leaves=JobState.queued)
    reason: str = "resumed by request"


class Succeeded(JobEvent):
    event: Literal["succeeded"] = "succeeded"
    meaning = sent_by("worker", leaves=JobState.succeeded)
    adapter: AdapterRef
    metrics: dict[str, float] = Field(default_factory=dict)
    # The attempt's committed checkpoints (steps) as its worker saw them commit: the record's
    # list, which the ``checkpointed`` events build, may miss one whose event is applied
    # after this one (a replay must start from a checkpoint that is still there).
    checkpoints: list[int] = Field(default_factory=list)


class Failed(JobEvent):
    event: Literal["failed"] = "failed"
    meaning = sent_by("worker", "scheduler", leaves=JobState.failed)
    reason: str


class Cancelled(JobEvent):
    event: Literal["cancelled"] = "cancelled"
    meaning = sent_by("worker", "scheduler", leaves=JobState.cancelled)
    reason: str = "cancelled by request"
    last_checkpoint_step: int | None = None


class Replayed(JobEvent):
    """A replay job's end (its worker's word): what replaying the target's steps measured."""

    event: Literal["replayed"] = "replayed"
    # A replay job registers no adapter, so it never ``succeeded``: this ends it.
    meaning = sent_by("worker", leaves=JobState.succeeded)
    worker_id: str
    report: ReplayReport


class Verified(JobEvent):
    """On the replayed job (the scheduler's word): whether its replay on another worker matched.

    ``outcome`` failed: the weights or losses differ beyond the tolerances; ``worker_id`` is
    then marked suspect, and ``action`` says what became of the job. ``error``: the replay
    itself could not be done (``reason``), which says nothing about the worker."""

    event: Literal["verified"] = "verified"
    # What the verification did to the job came just before, as its own event.
    meaning = sent_by("scheduler", leaves=None)
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
    | Paused
    | Resumed
    | Succeeded
    | Failed
    | Cancelled
    | Replayed
    | Verified
)
JOB_EVENT_CLASSES: tuple[type[JobEvent], ...] = get_args(AnyJobEvent)
MEANINGS: dict[str, EventMeaning] = {cls.name(): cls.meaning for cls in JOB_EVENT_CLASSES}
JOB_EVENTS: tuple[str, ...] = tuple(MEANINGS)
TERMINAL_EVENTS: frozenset[str] = frozenset(n for n, m in MEANINGS.items() if m.terminal)


def sent_by_worker(event: JobEvent) -> bool:
    """Whether a worker may send ``event`` (the others are the scheduler's alone)."""
    return "worker" in event.meaning.origin


def named(*classes: type[JobEvent]) -> frozenset[str]:
    """The names of these event classes (the subjects' last tokens)."""
    return frozenset(cls.name() for cls in classes)


class StateMeaning(BaseModel):
    name: JobState
    terminal: bool


class JobLifecycle(BaseModel):
    """The job states (in the order a job goes through them) and the job events, with what
    they mean: for clients that cannot import this package (the dashboard's JS)."""

    states: list[StateMeaning]
    events: dict[str, EventMeaning]


def job_lifecycle() -> JobLifecycle:
    states = [StateMeaning(name=s, terminal=s.terminal) for s in JobState]
    return JobLifecycle(states=states, events=MEANINGS)


class CancelRequest(BaseModel):
    """``data`` of a message on ``swarm.jobs.<job_id>.cancel``."""

    job_id: str
    reason: str = "cancelled by request"


class PauseRequest(BaseModel):
    """``data`` of a message on ``swarm.jobs.<job_id>.pause``: checkpoint the job, free its
    worker and keep it ``paused``."""

    job_id: str
    reason: str = "paused by request"


class ResumeRequest(BaseModel):
    """``data`` of a message on ``swarm.jobs.<job_id>.resume``: queue a paused job again."""

    job_id: str
    reason: str = "resumed by request"

"""Hyperparameter sweeps (contract): the sweep spec a user submits, the sweep and trial records
the sweeps controller keeps, and the events on ``swarm.sweeps.<sweep_id>.events.<event>``.

A sweep runs ``budget`` trials; each trial is an ordinary job whose spec is the sweep's
``base`` spec with the searched fields set (dotted paths such as ``training.lr``) and its
``name`` set to the sweep's name, so that every trial registers a version of one adapter and
the best one gets the alias ``best``.

Long because: the sweep contract in one place: its spec and search space, records and events
refer to each other and are read together (docs/events.md, *Sweeps*).
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from swarm_contracts.jobs import NAME_PATTERN, AdapterRef, JobSpec, Strict, job_id_for, utcnow
from swarm_contracts.names import METRIC_PATTERN

SWEEP_ID_PATTERN = r"^sweep-[0-9a-f]{8,64}$"
# The alias a finished sweep gives the best trial's adapter version.
BEST_ALIAS = "best"


class Uniform(Strict):
    """A float drawn uniformly from [low, high]."""

    type: Literal["uniform"]
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        return self


class LogUniform(Strict):
    """A float whose logarithm is uniform on [log low, log high] (learning rates)."""

    type: Literal["log_uniform"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LogUniform:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        return self


class IntRange(Strict):
    """An integer in [low, high], every ``step``-th (log-uniform with ``log``)."""

    type: Literal["int"]
    low: int
    high: int
    step: int = Field(default=1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if not self.low <= self.high:
            raise ValueError("low must not be above high")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("a log int range needs low >= 1 and step 1")
        return self

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


class Choice(Strict):
    """One of ``values`` (any JSON values: numbers, strings, lists such as target modules)."""

    type: Literal["choice"]
    values: list[Any] = Field(min_length=1, max_length=1000)

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        seen = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(seen)) != len(seen):
            raise ValueError("values must be distinct")
        return values


Param = Annotated[Uniform | LogUniform | IntRange | Choice, Field(discriminator="type")]


class Asha(Strict):
    """Asynchronous successive halving on the trials' ``validated`` events.

    Rungs are at steps ``min_step * reduction_factor**k`` below ``max_step``. A trial that
    reaches a rung (its first evaluation at or after that step) goes on only if its metric
    there is within the best ``1/reduction_factor`` of what the other trials had at that rung;
    otherwise its job is cancelled with reason ``pruned``.
    """

    type: Literal["asha"] = "asha"
    min_step: int | None = Field(
        default=None, ge=1, description="the first rung; default: the base spec's eval_every"
    )
    reduction_factor: int = Field(default=3, ge=2, le=16)
    max_step: int | None = Field(
        default=None, ge=1, description="no rung at or after it; default: the base max_steps"
    )


class TrialTemplate(JobSpec):
    """The base job spec of a sweep's trials: a job spec whose ``name`` may be left out (every
    trial is named after the sweep)."""

    name: str | None = Field(  # type: ignore[assignment]
        default=None, pattern=NAME_PATTERN, description="leave out: trials take the sweep's name"
    )


Algorithm = Literal["random", "grid", "bayes"]
# What every validation measures; any other sweep metric is a task eval's (``evals``).
LOSS_METRICS = ("eval_loss", "perplexity")


class SweepSpec(Strict):
    name: str = Field(
        pattern=NAME_PATTERN,
        description="adapter name: every trial registers a version of it; the best gets alias "
        "'best'",
    )
    base: TrialTemplate = Field(description="the job spec every trial starts from")
    algorithm: Algorithm = Field(
        default="bayes", description="random | grid | bayes (Optuna's TPE sampler)"
    )
    search: dict[str, Param] = Field(
        min_length=1,
        max_length=32,
        description="dotted job spec field -> its range, e.g. {'training.lr': {'type': "
        "'log_uniform', 'low': 1e-5, 'high': 1e-2}}",
    )
    metric: str = Field(
        default="eval_loss",
        pattern=METRIC_PATTERN,
        description="eval_loss, perplexity, or a metric of base.evals' graders (exact_match...)",
    )
    mode: Literal["min", "max"] = Field(
        default="min", description="default: max for a task eval's metric, else min"
    )
    budget: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        validate_default=True,
        description="how many trials in all (grid: at most, and by default, the grid's size)",
    )
    max_concurrent: int = Field(default=2, ge=1, le=256, description="trials in flight at once")
    seed: int = Field(default=0, ge=0)
    startup_trials: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="bayes: random trials before the sampler models the results; default "
        "max(2, min(10, budget // 3))",
    )
    early_stopping: Asha | None = None
    max_failed_trials: int = Field(
        default=3, ge=1, description="the sweep fails (and stops) once this many trials failed"
    )

    @model_validator(mode="before")
    @classmethod
    def _task_metric_is_maximised(cls, data: Any) -> Any:
        # A grader's metric is a pass rate: higher is better, unless the spec says otherwise.
        if (
            isinstance(data, dict)
            and "mode" not in data
            and data.get("metric", "eval_loss") not in LOSS_METRICS
        ):
            return {**data, "mode": "max"}
        return data

    @model_validator(mode="after")
    def _base_name(self) -> SweepSpec:
        if self.base.name not in (None, self.name):
            raise ValueError(f"base.name must be left out or equal name ({self.name!r})")
        if self.metric not in LOSS_METRICS:
            known = self.base.evals.metrics if self.base.evals else []
            if self.metric not in known:
                raise ValueError(
                    f"metric {self.metric!r} is neither eval_loss, perplexity nor a metric of "
                    f"base.evals' graders ({', '.join(known) or 'base has no evals'})"
                )
        return self

    @field_validator("search")
    @classmethod
    def _searchable(cls, search: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        base = info.data.get("base")
        for path, param in search.items():
            problem = check_param(base, path, param)
            if problem:
                raise ValueError(f"search.{path}: {problem}")
        if info.data.get("algorithm") == "grid":
            loose = [p for p, v in search.items() if isinstance(v, Uniform | LogUniform)]
            if loose:
                raise ValueError(f"search.{loose[0]}: grid search needs choice or int parameters")
        return search

    @field_validator("budget")
    @classmethod
    def _budget(cls, budget: int | None, info: ValidationInfo) -> int | None:
        search = info.data.get("search")
        if info.data.get("algorithm") != "grid":
            if budget is None:
                raise ValueError("budget is required (how many trials to run)")
            return budget
        if search is None:
            return budget  # the search space was refused already
        size = grid_size(search)
        if budget is not None and budget > size:
            raise ValueError(f"budget {budget} is above the grid's {size} points")
        return budget if budget is not None else min(size, 1000)

    @property
    def trials(self) -> int:
        assert self.budget is not None  # set by validation
        return self.budget

    def startup(self) -> int:
        return self.startup_trials or max(2, min(10, self.trials // 3))


# --- the search space over a job spec -------------------------------------------------------


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: itself, or each of a union's (``method``: sft | dpo)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    members = [a for a in get_args(annotation) if isinstance(a, type)]
    if members and all(issubclass(a, BaseModel) for a in members):
        return members
    return []


def _leaf(path: str) -> tuple[Any, str | None]:
    """The annotation of job spec field ``path`` (dotted), or an error. In a union of
    sections (``method``) the field of whichever member has it (``method.beta``: DPO's; the
    base spec's method must then be that member, which ``_probe`` checks)."""
    models: list[type[BaseModel]] = [JobSpec]
    parts = path.split(".")
    if parts[0] == "name":
        return None, "trials are named after the sweep; name cannot be searched"
    for i, part in enumerate(parts):
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if field is None:
            where = ".".join(parts[:i]) or "the job spec"
            return None, f"{where} has no field {part!r}"
        annotation = field.annotation
        last = i == len(parts) - 1
        sections = _sections(annotation)
        if last:
            if sections:
                return None, "name a field inside it (e.g. training.lr), not a whole section"
            return annotation, None
        if not sections:
            return None, f"{'.'.join(parts[: i + 1])} has no fields"
        models = sections
    raise AssertionError("unreachable")


def set_path(spec: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = spec
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _probe(base: TrialTemplate | None, path: str, value: Any) -> str | None:
    """Why ``value`` at ``path`` makes the base spec invalid, or None."""
    spec = base.model_dump(mode="json") if base is not None else {}
    spec["name"] = "probe"
    set_path(spec, path, value)
    try:
        JobSpec.model_validate(spec)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if ".".join(map(str, e["loc"])) == path]
        if base is None and not errors:
            return None  # the base itself was refused; that error is reported there
        first = (errors or exc.errors())[0]
        return f"{json.dumps(value)} is not valid there: {first['msg']}"
    return None


def check_param(base: TrialTemplate | None, path: str, param: Any) -> str | None:
    """Why ``param`` cannot search ``path`` of ``base``, or None when it can."""
    annotation, problem = _leaf(path)
    if problem:
        return problem
    if isinstance(param, Uniform | LogUniform) and annotation is not float:
        return f"{param.type} draws floats; this field is not a float (use int or choice)"
    if isinstance(param, IntRange) and annotation not in (int, float):
        return "int draws integers; this field is not a number (use choice)"
    probes = param.values if isinstance(param, Choice) else [param.low, param.high]
    for value in probes:
        problem = _probe(base, path, value)
        if problem:
            return problem
    return None


def grid_values(param: Any) -> list[Any]:
    if isinstance(param, Choice):
        return list(param.values)
    if isinstance(param, IntRange):
        return list(param.values())
    raise ValueError(f"{param.type} has no grid")


def grid_size(search: dict[str, Any]) -> int:
    return math.prod(len(grid_values(p)) for p in search.values())


def grid_point(search: dict[str, Any], index: int) -> dict[str, Any]:
    """The ``index``-th point of the grid (the last parameter varying fastest), computed
    directly rather than by enumerating a product that may be large."""
    point: dict[str, Any] = {}
    for path in reversed(list(search)):
        values = grid_values(search[path])
        index, i = divmod(index, len(values))
        point[path] = values[i]
    return {path: point[path] for path in search}


def trial_spec(spec: SweepSpec, params: dict[str, Any]) -> JobSpec:
    """The job spec of a trial: the base spec, named after the sweep, with ``params`` set."""
    data = spec.base.model_dump(mode="json")
    data["name"] = spec.name
    for path, value in params.items():
        set_path(data, path, value)
    return JobSpec.model_validate(data)


# --- submission and records -------------------------------------------------------------------


class SweepSubmission(Strict):
    """The ``data`` of a message on ``swarm.sweeps.submit``."""

    spec: SweepSpec
    tenant: str = Field(default="default", pattern=NAME_PATTERN)
    sweep_id: str | None = Field(default=None, pattern=SWEEP_ID_PATTERN)


class SweepCancelRequest(BaseModel):
    """``data`` of a message on ``swarm.sweeps.<sweep_id>.cancel``."""

    sweep_id: str
    reason: str = "cancelled by request"


def sweep_id_for(tenant: str, idempotency_key: str) -> str:
    """A sweep id that is a pure function of who asked and their idempotency key."""
    digest = hashlib.sha256(f"{tenant}\x00sweep\x00{idempotency_key}".encode()).hexdigest()
    return "sweep-" + digest[:20]


def trial_job_id(tenant: str, sweep_id: str, trial: int) -> str:
    """The job id of trial ``trial``: derived from the sweep id and the trial number, so that
    a controller that submits it again (after a restart) never makes a second job."""
    return job_id_for(tenant, trial_idempotency_key(sweep_id, trial))


def trial_idempotency_key(sweep_id: str, trial: int) -> str:
    return f"{sweep_id}.trial-{trial}"


class SweepState(StrEnum):
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is not SweepState.running


class TrialState(StrEnum):
    pending = "pending"  # recorded, its job maybe not submitted yet
    queued = "queued"  # its job is submitted
    running = "running"  # its job started on a worker
    succeeded = "succeeded"
    pruned = "pruned"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (
            TrialState.succeeded,
            TrialState.pruned,
            TrialState.failed,
            TrialState.cancelled,
        )


class BestTrial(BaseModel):
    trial: int
    value: float
    params: dict[str, Any]
    job_id: str
    adapter: AdapterRef | None = None


class TrialRecord(BaseModel):
    """One trial, one KV entry ``<sweep_id>.<trial>`` in bucket ``swarm_trials``."""

    sweep_id: str
    trial: int
    job_id: str
    params: dict[str, Any]
    state: TrialState = TrialState.pending
    # The metric at each evaluation step (from the job's ``validated`` events).
    evals: dict[int, float] = Field(default_factory=dict)
    value: float | None = Field(default=None, description="the trial's final metric")
    reason: str | None = None
    adapter: AdapterRef | None = None
    pruned_at_step: int | None = None
    prune_cutoff: float | None = None
    # The trials whose results the searcher had been told when it proposed this one.
    told: list[int] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None

    @property
    def key(self) -> str:
        return trial_key(self.sweep_id, self.trial)


def trial_key(sweep_id: str, trial: int) -> str:
    return f"{sweep_id}.{trial:05d}"


class SweepRecord(BaseModel):
    """One sweep, one KV entry in bucket ``swarm_sweeps``; its trials are in ``swarm_trials``."""

    sweep_id: str
    tenant: str
    spec: SweepSpec
    state: SweepState = SweepState.running
    reason: str | None = None
    best: BestTrial | None = None
    cancel_requested: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class SweepDetail(SweepRecord):
    """``GET /v1/sweeps/{id}``: the record with its trials table."""

    trials: list[TrialRecord] = Field(default_factory=list)


# --- events on swarm.sweeps.<sweep_id>.events.<event> -------------------------------------------

SweepEventName = Literal[
    "created",
    "trial_started",
    "trial_pruned",
    "trial_finished",
    "best_changed",
    "completed",
    "failed",
    "cancelled",
]
SWEEP_EVENTS: tuple[str, ...] = get_args(SweepEventName)
SWEEP_TERMINAL_EVENTS = ("completed", "failed", "cancelled")


class SweepEvent(BaseModel):
    event: SweepEventName
    sweep_id: str


class SweepCreated(SweepEvent):
    event: Literal["created"] = "created"
    tenant: str
    spec: SweepSpec


class TrialStarted(SweepEvent):
    event: Literal["trial_started"] = "trial_started"
    trial: int
    job_id: str
    params: dict[str, Any]
    told: list[int] = Field(default_factory=list)


class TrialPruned(SweepEvent):
    event: Literal["trial_pruned"] = "trial_pruned"
    trial: int
    job_id: str
    step: int
    value: float
    cutoff: float


class TrialFinished(SweepEvent):
    event: Literal["trial_finished"] = "trial_finished"
    trial: int
    job_id: str
    state: TrialState
    value: float | None = None
    reason: str | None = None
    adapter: AdapterRef | None = None


class BestChanged(SweepEvent):
    event: Literal["best_changed"] = "best_changed"
    best: BestTrial
    previous: BestTrial | None = None


class SweepCompleted(SweepEvent):
    event: Literal["completed"] = "completed"
    best: BestTrial | None = None
    alias: str = BEST_ALIAS
    trials: dict[str, int] = Field(default_factory=dict, description="trial state -> count")


class SweepFailed(SweepEvent):
    event: Literal["failed"] = "failed"
    reason: str


class SweepCancelled(SweepEvent):
    event: Literal["cancelled"] = "cancelled"
    reason: str


AnySweepEvent = (
    SweepCreated
    | TrialStarted
    | TrialPruned
    | TrialFinished
    | BestChanged
    | SweepCompleted
    | SweepFailed
    | SweepCancelled
)

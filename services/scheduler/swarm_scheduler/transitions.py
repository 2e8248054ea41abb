"""How a job record changes when a job event arrives: pure functions, fenced by attempt."""

from __future__ import annotations

from swarm_contracts.events import (
    AnyJobEvent,
    Cancelled,
    CheckpointSaved,
    Failed,
    Progress,
    Replayed,
    Started,
    Succeeded,
    Validated,
)
from swarm_contracts.jobs import JobRecord, JobState, utcnow
from swarm_contracts.layout import CHECKPOINTS_KEPT
from swarm_contracts.providers import token_matches as attempt_token_matches
from swarm_scheduler.placement import HOLDING


def copy_record(record: JobRecord) -> JobRecord:
    """A copy safe to change: top-level fields are replaced, never changed in place, except
    ``metrics``, which gets its own dict. Much cheaper than ``model_copy(deep=True)``, which
    deep-copies the whole spec on every transition."""
    return record.model_copy(update={"metrics": dict(record.metrics)})


def is_stale(record: JobRecord, event: AnyJobEvent) -> bool:
    """An event from any attempt but the current one comes from a worker that lost its lease."""
    return event.attempt != record.attempt


def token_matches(record: JobRecord, token: str | None) -> bool:
    """Whether an event carrying ``token`` comes from the worker given the current attempt."""
    return attempt_token_matches(record.attempt_token_sha256, token)


def taken_back(
    r: JobRecord,
    *,
    worker_id: str,
    reason: str,
    cancel: bool,
    handback: bool,
    max_attempts: int,
) -> JobRecord | None:
    """The record (a copy, changed in place) once ``worker_id`` no longer holds the job: queued
    again, paused if a pause was asked, cancelled if a cancel was (or ``cancel``), or failed
    once ``max_attempts`` attempts failed; None when the worker does not hold it.

    Only attempts that failed (the worker lost, restarted, silent, or at fault) count against
    ``max_attempts`` (``faults``); ``handback``: the worker gave it back on purpose (drain,
    shutdown, pause), which counts nothing."""
    if r.state not in HOLDING or r.worker_id != worker_id:
        return None
    if not handback:
        r.faults += 1
    if cancel:
        r.state, r.reason = JobState.cancelled, reason
    elif r.cancel_requested:
        r.state, r.reason = JobState.cancelled, f"cancelled ({reason})"
    elif r.pause_requested:
        # Paused rather than queued, however it came back (handed back, or its worker lost):
        # no worker, nothing held, until a resume queues it from its checkpoint.
        r.state, r.reason = JobState.paused, f"paused: {reason}"
        r.pause_requested, r.pause_requested_at = False, None
    elif r.faults >= max_attempts:
        r.state, r.reason = JobState.failed, f"{reason}; gave up after {r.faults} attempts"
    else:
        r.state, r.reason = JobState.queued, f"requeued: {reason}"
    if not r.state.terminal:
        r.worker_id, r.assigned_at = None, None
        r.metrics.pop("step", None)  # the next attempt's progress starts from its resume
    return r


def kept_checkpoints(checkpoints: list[int], step: float | None) -> list[int]:
    """The run's committed checkpoints with ``step`` added, as many as Ray keeps."""
    added = {int(step)} if step is not None else set()
    return sorted({*checkpoints, *added})[-CHECKPOINTS_KEPT:]


def preference_metrics(event: Progress | Validated) -> dict[str, float]:
    """A DPO job's rewards for the record's metrics (none for SFT). A step's and an
    evaluation's would share names: ``eval_`` marks the evaluation's."""
    if event.preference is None:
        return {}
    prefix = "eval_" if isinstance(event, Validated) else ""
    return {prefix + name: value for name, value in event.preference.model_dump().items()}


def apply_event(
    record: JobRecord, event: AnyJobEvent, token: str | None = None
) -> JobRecord | None:
    """The record after ``event``, or None when the event changes nothing: it is stale, not
    from the attempt's worker (``token``), or of a kind that changes no record.

    Events the scheduler emits itself (queued, assigned, requeued) are already reflected in the
    record when they come back, so they change nothing here.
    """
    if record.state.terminal or is_stale(record, event) or not token_matches(record, token):
        return None
    new = copy_record(record)
    match event:
        case Started() if record.state == JobState.assigned:
            new.state = JobState.running
        case Progress() if event.step < record.metrics.get("step", 0):
            # Events are applied concurrently: an older report may come last. The record
            # keeps the latest (a requeue clears the step: a new attempt starts lower).
            return None
        case Progress():
            new.metrics.update(step=event.step, loss=event.loss, tokens_per_s=event.tokens_per_s)
            new.metrics.update(preference_metrics(event))
        case Validated():
            task = event.evals.metrics if event.evals else {}
            new.metrics.update(task, eval_loss=event.eval_loss, perplexity=event.perplexity)
            new.metrics.update(preference_metrics(event))
            new.evals = event.evals or new.evals
        case CheckpointSaved() if event.step < record.metrics.get("checkpoint_step", 0):
            return None
        case CheckpointSaved():
            new.metrics.update(checkpoint_step=event.step)
            new.checkpoints = kept_checkpoints(record.checkpoints, event.step)
        case Succeeded():
            new.state = JobState.succeeded
            new.adapter = event.adapter
            new.metrics.update(event.metrics)
            new.reason = None
            # The run's last checkpoint is of its last step, and `checkpointed` events may be
            # applied after this one (then not at all: the record has ended): the worker's
            # own list completes the record's.
            seen = sorted({*record.checkpoints, *event.checkpoints})
            new.checkpoints = kept_checkpoints(seen, event.metrics.get("step"))
        case Replayed() if record.verify is not None:
            # A replay's end: what it measured is judged by the scheduler (verification).
            new.state = JobState.succeeded
            new.reason = None
            _, distance = event.report.worst
            new.metrics.update(max_relative_l2=distance, step=event.report.to_step)
        case Failed():
            new.state = JobState.failed
            new.reason = event.reason
        case Cancelled():
            new.state = JobState.cancelled
            new.reason = event.reason
        case _:
            return None
    new.updated_at = utcnow()
    return new

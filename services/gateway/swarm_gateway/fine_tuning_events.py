"""A job's stored events, read once (not followed), as OpenAI's ``fine_tuning.job.event``
and ``fine_tuning.job.checkpoint`` objects, and the tokens it trained on.

Events come from the replayable events stream, the same history ``GET /v1/jobs/{id}/events``
streams; their ids are ``ftevent-<stream sequence>``. ``progress`` and ``validated`` are
``metrics`` events (OpenAI's ``step``/``train_loss``/``valid_loss``...); the rest are
``message`` events whose ``data`` is Swarm's event. A checkpoint is one the job's record
lists as committed and kept, with the metrics reported at its step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel

from swarm_contracts.events import Released, Requeued, named
from swarm_contracts.jobs import JobRecord
from swarm_gateway.state import Gateway

READ_TIMEOUT_S = 2.0
EVENT_PREFIX = "ftevent-"
# Events of an attempt that ended without ending the job: OpenAI's "warn" level.
LOST_ATTEMPT = named(Requeued, Released)


@dataclass(frozen=True)
class StoredEvent:
    sequence: int
    name: str
    time: datetime
    data: dict[str, Any]


async def stored_events(gw: Gateway, job_id: str) -> list[StoredEvent]:
    """Every event of the job stored so far, oldest first."""
    sub = await gw.js.subscribe(
        gw.subjects.job_event(job_id, "*"),
        stream=gw.subjects.events_stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    found: list[StoredEvent] = []
    try:
        info = await sub.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered is not None else 0
        if info.num_pending == 0 and not delivered:
            return found  # nothing stored (yet)
        while True:
            msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
            envelope = json.loads(msg.data)
            found.append(
                StoredEvent(
                    sequence=msg.metadata.sequence.stream,
                    name=msg.subject.rsplit(".", 1)[-1],
                    time=datetime.fromisoformat(envelope["time"]),
                    data=envelope.get("data") or {},
                )
            )
            if msg.metadata.num_pending == 0:
                return found
    finally:
        await sub.unsubscribe()


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] | None = None


def _message(name: str, d: dict[str, Any]) -> str:
    if (where := _placement(name, d)) is not None:
        return where
    match name:
        case "started":
            resumed = d.get("resumed_from_step") or 0
            return f"Training started{f' from step {resumed}' if resumed else ''}"
        case "progress":
            return f"Step {d.get('step')}/{d.get('max_steps')}: training loss={d.get('loss'):.4f}"
        case "validated":
            return f"Step {d.get('step')}: validation loss={d.get('eval_loss'):.4f}"
        case "checkpoint":
            return f"Checkpoint committed at step {d.get('step')}"
        case "succeeded":
            adapter = d.get("adapter") or {}
            return f"Job succeeded: fine-tuned model {adapter.get('name')}@{adapter.get('version')}"
        case "failed":
            return f"Job failed: {d.get('reason')}"
        case "cancelled":
            return f"Job cancelled: {d.get('reason')}"
        case "verified":
            why = d.get("reason") or "replayed on another worker"
            return f"Verification {d.get('outcome')}: {why}"
    return name


def _placement(name: str, d: dict[str, Any]) -> str | None:
    """Where the job is (queued, on a worker, handed back, paused), in words; None for
    another event."""
    match name:
        case "queued":
            return "Job queued" + (f": {d['reason']}" if d.get("reason") else "")
        case "assigned":
            return f"Job placed on worker {d.get('worker_id')}"
        case "requeued":
            return f"Job requeued: {d.get('reason')}"
        case "released":
            return f"Worker {d.get('worker_id')} handed the job back: {d.get('reason')}"
        case "paused":
            step = d.get("last_checkpoint_step")
            return "Job paused" + (f" at the checkpoint of step {step}" if step else "")
        case "resumed":
            return "Job resumed"
    return None


def _level(name: str) -> Literal["info", "warn", "error"]:
    if name == "failed":
        return "error"
    return "warn" if name in LOST_ATTEMPT else "info"


def _metrics(name: str, d: dict[str, Any]) -> dict[str, Any] | None:
    if name == "progress":
        return {
            "step": d.get("step"),
            "train_loss": d.get("loss"),
            "total_steps": d.get("max_steps"),
            "learning_rate": d.get("lr"),
            "tokens_per_s": d.get("tokens_per_s"),
        }
    if name == "validated":
        return {"step": d.get("step"), "valid_loss": d.get("eval_loss"), "total_steps": None}
    return None


def openai_event(event: StoredEvent) -> FineTuningJobEvent:
    metrics = _metrics(event.name, event.data)
    return FineTuningJobEvent(
        id=f"{EVENT_PREFIX}{event.sequence}",
        created_at=int(event.time.timestamp()),
        level=_level(event.name),
        message=_message(event.name, event.data),
        type="metrics" if metrics is not None else "message",
        data=metrics if metrics is not None else {"event": event.name, **event.data},
    )


def event_sequence(event_id: str) -> int | None:
    raw = event_id.removeprefix(EVENT_PREFIX)
    return int(raw) if event_id.startswith(EVENT_PREFIX) and raw.isdigit() else None


def trained_tokens(events: list[StoredEvent]) -> int | None:
    """Tokens over the steps the job trained, each step counted once (a resumed attempt
    redoes some: the last report of a step counts); None when its trainer did not count."""
    per_step: dict[int, int] = {}
    for e in events:
        if e.name == "progress":
            tokens = e.data.get("tokens")
            if tokens is None:
                return None
            per_step[int(e.data.get("step", 0))] = int(tokens)
    return sum(per_step.values()) if per_step else None


class CheckpointMetrics(BaseModel):
    step: float
    train_loss: float | None = None
    valid_loss: float | None = None
    full_valid_loss: float | None = None


class FineTuningJobCheckpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


def checkpoint_id(job_id: str, step: int) -> str:
    return f"ftckpt-{job_id.removeprefix('job-')}-{step}"


def checkpoints(
    record: JobRecord, events: list[StoredEvent], ftjob: str
) -> list[FineTuningJobCheckpoint]:
    """The record's committed, kept checkpoints, newest first, with the metrics at their step
    (the attempt that wrote each is the record's current one)."""
    attempt = record.attempt
    saved: dict[int, datetime] = {}
    train: dict[int, float] = {}
    valid: dict[int, float] = {}
    for e in events:
        if e.data.get("attempt", attempt) != attempt:
            continue
        step = e.data.get("step")
        if e.name == "checkpoint" and step is not None:
            saved[int(step)] = e.time
        elif e.name == "progress" and step is not None:
            train[int(step)] = float(e.data["loss"])
        elif e.name == "validated" and step is not None:
            valid[int(step)] = float(e.data["eval_loss"])
    found = []
    for step in sorted(set(record.checkpoints), reverse=True):
        when = saved.get(step, record.updated_at)
        found.append(
            FineTuningJobCheckpoint(
                id=checkpoint_id(record.job_id, step),
                created_at=int(when.timestamp()),
                # What Swarm's ``from_checkpoint`` names a checkpoint by: JOB_ID@STEP.
                fine_tuned_model_checkpoint=f"{record.job_id}@{step}",
                fine_tuning_job_id=ftjob,
                metrics=CheckpointMetrics(
                    step=step,
                    train_loss=train.get(step),
                    valid_loss=valid.get(step),
                    full_valid_loss=valid.get(step),
                ),
                step_number=step,
            )
        )
    return found

"""What a chaos run must leave behind, checked from the outside: the job records, every job's
event stream (read straight from JetStream) and the registered adapters.

Pure functions of what was read, so that they are tested on made-up histories too
(``test_invariants.py``): a checker that cannot fail proves nothing.

"Gap-free per attempt" is defined from what the events carry. A job event has no sequence
number of its own (the stream sequence is shared by every job), but ``progress`` carries the
step, ``started`` the step the attempt resumed from, ``checkpoint`` the committed step. So an
attempt's stream is gap-free when its ``progress`` steps, in stream order, are exactly
``resumed_from_step + 1, + 2, …`` with no step missing or repeated, its ``checkpoint`` steps
strictly increase above ``resumed_from_step``, and an attempt that succeeded reported every
step up to ``max_steps``. (A publish the trainer retried is stored once: ``Nats-Msg-Id`` is
``<job>.<attempt>.<event>.<step>``.)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Event:
    """One stored job event: its stream sequence, name, attempt, publish time (epoch s), data."""

    seq: int
    name: str
    attempt: int
    time: float
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Adapter:
    """A registered version as the registry lists it, and the sha256 of its files as read
    back from the object store now."""

    version: int
    files: Mapping[str, str]  # what the registry recorded: file name -> sha256
    stored: Mapping[str, str]  # what the store holds now
    job_id: str
    attempt: int


def _by_attempt(events: Iterable[Event]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for e in events:
        out.setdefault(e.attempt, []).append(e)
    return out


def check_job(
    record: Mapping[str, Any] | None,
    events: list[Event],
    adapters: list[Adapter],
) -> list[str]:
    """Every invariant of one job; each violation as a line naming it. ``record``: the job
    record (``GET /v1/jobs/{id}``), None when the job vanished; ``events``: its stream in
    stream order; ``adapters``: the versions registered under the job's adapter name."""
    if record is None:
        return ["vanished: no job record"]
    out = _ends_once(record, events)
    out += _one_intact_version(record, adapters)
    out += _no_stale_event_applied(record, events)
    last = record["state"] == "succeeded"
    for k, attempt_events in sorted(_by_attempt(events).items()):
        out += _gaps(k, attempt_events, last and k == record["attempt"])
    return out


def _ends_once(record: Mapping[str, Any], events: list[Event]) -> list[str]:
    """A terminal record, and one terminal event in the stream, of the record's attempt."""
    state, attempt = record["state"], record["attempt"]
    out = []
    terminal = [e for e in events if e.name in TERMINAL]
    if state not in TERMINAL:
        out.append(f"not ended: record is {state}")
    if len(terminal) != 1:
        out.append(f"{len(terminal)} terminal events: {[(e.name, e.attempt) for e in terminal]}")
    elif (terminal[0].name, terminal[0].attempt) != (state, attempt):
        t = terminal[0]
        out.append(f"terminal event {t.name}#{t.attempt} but record {state}#{attempt}")
    return out


def _one_intact_version(record: Mapping[str, Any], adapters: list[Adapter]) -> list[str]:
    """A succeeded job has exactly one version, made by its last attempt, its files intact;
    any other job has none."""
    state, attempt = record["state"], record["attempt"]
    mine = [a for a in adapters if a.job_id == record["job_id"]]
    if state != "succeeded":
        return [f"{state} job has adapter versions {[a.version for a in mine]}"] if mine else []
    out = [] if len(mine) == 1 else [f"{len(mine)} adapter versions for a succeeded job"]
    for a in mine:
        if (record.get("adapter") or {}).get("version") != a.version:
            out.append(f"record names adapter {record.get('adapter')}, registry v{a.version}")
        if a.attempt != attempt:
            out.append(f"adapter v{a.version} registered by attempt {a.attempt}, not {attempt}")
        if not a.files or dict(a.files) != dict(a.stored):
            out.append(f"adapter v{a.version} files differ from their sha256: {a.stored}")
    return out


def _no_stale_event_applied(record: Mapping[str, Any], events: list[Event]) -> list[str]:
    """What the record shows is its last attempt's: its worker, and the figures of that
    attempt's last progress and checkpoint events (a stale attempt's later event, had it been
    applied, would show instead)."""
    attempt = record["attempt"]
    current = [e for e in events if e.attempt == attempt]
    out = []
    started = [e for e in current if e.name == "started"]
    if started and record.get("worker_id") != started[0].data.get("worker_id"):
        out.append(f"record worker {record.get('worker_id')} is not attempt {attempt}'s")
    # The scheduler applies a job's events concurrently, so the record may show any of the
    # attempt's progress events, not necessarily its last; but one of this attempt's.
    progress = {(e.data["loss"], e.data["tokens_per_s"]) for e in current if e.name == "progress"}
    metrics = record.get("metrics") or {}
    shown = (metrics.get("loss"), metrics.get("tokens_per_s"))
    if progress and shown not in progress:
        out.append(f"record loss, tokens/s {shown} are from no progress of attempt {attempt}")
    checkpoints = {e.data["step"] for e in current if e.name == "checkpoint"}
    if checkpoints and metrics.get("checkpoint_step") not in checkpoints:
        out.append(f"record checkpoint_step {metrics.get('checkpoint_step')} is not attempt's")
    return out


def _gaps(k: int, events: list[Event], succeeded: bool) -> list[str]:
    names = [e.name for e in events]
    started = [e for e in events if e.name == "started"]
    progress = [e.data["step"] for e in events if e.name == "progress"]
    if not started:
        # Assigned, then lost before it started (or a scheduler-only attempt): nothing to run.
        return [f"attempt {k} reported progress without starting"] if progress else []
    out = []
    if len(started) > 1:
        out.append(f"attempt {k} started {len(started)} times")
    if "assigned" in names and names.index("assigned") > names.index("started"):
        out.append(f"attempt {k} started before it was assigned")
    # (A resume may start beyond the steps earlier attempts *reported*: a trainer killed
    # right after Ray committed a checkpoint never sent the last steps' events.)
    resumed = started[0].data.get("resumed_from_step", 0)
    if not _progress_in_order(events, resumed):
        out.append(f"attempt {k} progress steps {progress} after resuming from {resumed}")
    if succeeded and progress:
        max_steps = next(e.data["max_steps"] for e in events if e.name == "progress")
        if progress[-1] != max_steps:
            out.append(f"attempt {k} succeeded at step {progress[-1]} of {max_steps}")
    saved = [e.data["step"] for e in events if e.name == "checkpoint"]
    if saved != sorted(set(saved)) or (saved and saved[0] <= resumed):
        out.append(f"attempt {k} checkpoint steps {saved} after resuming from {resumed}")
    return out


def _progress_in_order(events: list[Event], resumed: int) -> bool:
    """An attempt's progress goes one step at a time from the step after its resume point,
    except where Ray Train restarted the run inside the attempt (a rank lost: its
    ``FailureConfig``). That run resumes from its own latest checkpoint, so it repeats the steps
    since: not from before the attempt's resume point or a checkpoint the attempt announced,
    and never beyond the last step reported (rank 0 hands a step's progress to the agent before
    it saves that step's checkpoint)."""
    expected, high, announced = resumed + 1, resumed, resumed
    for e in events:
        if e.name == "checkpoint":
            announced = max(announced, e.data["step"])
        elif e.name == "progress":
            step = e.data["step"]
            restarted = high > resumed and max(resumed, announced) < step <= high
            if step != expected and not restarted:
                return False
            expected, high = step + 1, max(high, step)
    return True


def steps_lost(events: list[Event]) -> int:
    """Steps trained again after resumes: for each attempt, how far earlier attempts had got
    beyond the checkpoint it resumed from."""
    lost, trained = 0, 0
    for _, attempt_events in sorted(_by_attempt(events).items()):
        started = [e for e in attempt_events if e.name == "started"]
        if started:
            lost += max(0, trained - started[0].data.get("resumed_from_step", 0))
        steps = [e.data["step"] for e in attempt_events if e.name == "progress"]
        trained = max([trained, *steps])
    return lost


def recovery_s(events: list[Event], fault_start: float, fault_end: float) -> float | None:
    """Seconds from a fault's start to the job's next progress step published after the fault
    was over (or its success, when an attempt resumed at the last step had none left to
    train), from an attempt that was current then (the stale attempt of a frozen worker,
    woken up, does not count); None when it made no progress after it (it failed, say)."""
    current = 0
    for e in events:
        if e.name == "assigned":
            current = max(current, e.attempt)
        elif e.name in ("progress", "succeeded") and e.time > fault_end and e.attempt >= current:
            return e.time - fault_start
    return None


@dataclass
class FaultStats:
    injected: int = 0
    affected: int = 0
    recovered: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated; one value is its own every percentile."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]

"""Which assigned or running jobs have lost their lease, as a pure function of the records.

A placement is a lease the worker must keep confirming: by a ``started`` event within
``assign_timeout_s`` of the assignment, then by listing the job in its heartbeats. A job whose
lease lapses is requeued with the next attempt number; the old attempt's late events are then
stale and ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from swarm_contracts.jobs import JobRecord, JobState

HOLDING = (JobState.assigned, JobState.running)


@dataclass(frozen=True)
class Overdue:
    job_id: str
    worker_id: str
    action: Literal["requeue", "cancel"]
    reason: str


@dataclass(frozen=True)
class LeaseClock:
    now: datetime  # wall clock, compared with timestamps in the records
    mono: float  # this process's monotonic clock, compared with what it observed itself
    assign_timeout_s: float
    cancel_grace_s: float


def overdue(
    records: Iterable[JobRecord],
    clock: LeaseClock,
    *,
    alive: Callable[[str], bool],
    trust_absence: Callable[[str], bool],
    last_listed: Callable[[JobRecord], float],
) -> list[Overdue]:
    """Jobs to requeue (or, when a cancel was asked, to end).

    ``trust_absence(worker)``: whether a worker that is not alive is really lost, rather than
    not heard from yet by a scheduler that has just started or taken over.
    ``last_listed(record)``: when (monotonic) this process last knew the job to be listed by its
    worker's heartbeats, or first saw it running.
    """
    out = []
    for r in records:
        w = r.worker_id
        if r.state not in HOLDING or not w:
            continue
        if not alive(w):
            if trust_absence(w):
                out.append(Overdue(r.job_id, w, "requeue", f"worker {w} lost"))
            continue
        if r.state == JobState.assigned:
            if r.cancel_requested and r.cancel_requested_at is not None:
                waited = (clock.now - r.cancel_requested_at).total_seconds()
                if waited > clock.cancel_grace_s:
                    reason = f"cancelled before worker {w} started it"
                    out.append(Overdue(r.job_id, w, "cancel", reason))
                    continue
            if r.assigned_at is not None:
                waited = (clock.now - r.assigned_at).total_seconds()
                if waited > clock.assign_timeout_s:
                    reason = f"worker {w} did not start it within {clock.assign_timeout_s:g}s"
                    out.append(Overdue(r.job_id, w, "requeue", reason))
        elif clock.mono - last_listed(r) > clock.assign_timeout_s:
            reason = f"worker {w} stopped listing it for {clock.assign_timeout_s:g}s"
            out.append(Overdue(r.job_id, w, "requeue", reason))
    return out

"""Which assigned or running jobs have lost their lease, as a pure function of the records.

A placement is a lease the worker must keep confirming: by a ``started`` event within
``assign_timeout_s`` of the assignment, then by listing the job in its heartbeats. A job whose
lease lapses is requeued with the next attempt number; the old attempt's late events are then
stale and ignored.

A lease belongs to one attempt: what this process observed of a job (``LeaseBook``) counts
only for the attempt it was observed of, so a job that ran longer than every timeout before
it lost its worker starts its next attempt with a fresh lease.
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


class LeaseBook:
    """When this process first saw each held job's attempt running, and when a heartbeat of
    its worker last listed it: per job, the attempt the time is of and the time (monotonic).
    Only the times of the record's current attempt count (``last_listed``)."""

    def __init__(self) -> None:
        self._running_seen: dict[str, tuple[int, float]] = {}
        self._listed: dict[str, tuple[int, float]] = {}

    def listed(self, job_id: str, attempt: int, now: float) -> None:
        """A heartbeat listed the job's ``attempt``."""
        previous = self._listed.get(job_id)
        # A stale worker (frozen past its lease, then woken) still lists the old attempt
        # until it notices: it must not hide the current attempt's confirmations.
        if previous is None or attempt >= previous[0]:
            self._listed[job_id] = (attempt, now)

    def observe(self, records: Iterable[JobRecord], now: float) -> None:
        """Note the running records' attempts this process had not yet seen running."""
        for r in records:
            if r.state == JobState.running:
                seen = self._running_seen.get(r.job_id)
                if seen is None or seen[0] != r.attempt:
                    self._running_seen[r.job_id] = (r.attempt, now)

    def last_listed(self, record: JobRecord, now: float) -> float:
        """When this process last knew ``record``'s attempt to be listed by its worker, or
        first saw that attempt running (``now`` if it has not yet)."""
        seen = self._running_seen.get(record.job_id)
        since = seen[1] if seen is not None and seen[0] == record.attempt else now
        listed = self._listed.get(record.job_id)
        if listed is not None and listed[0] == record.attempt:
            return max(since, listed[1])
        return since

    def restart(self) -> None:
        """Count running jobs' leases from now (this process has just taken over)."""
        self._running_seen.clear()

    def forget(self, job_id: str) -> None:
        self._running_seen.pop(job_id, None)
        self._listed.pop(job_id, None)


@dataclass(frozen=True)
class LeaseClock:
    now: datetime  # wall clock, compared with timestamps in the records
    mono: float  # this process's monotonic clock, compared with what it observed itself
    assign_timeout_s: float
    cancel_grace_s: float
    pause_grace_s: float = 120.0


def _unanswered_stop(r: JobRecord, w: str, clock: LeaseClock) -> Overdue | None:
    """A cancel or a pause the worker has not answered in time."""
    if r.cancel_requested and r.cancel_requested_at is not None:
        # The worker reports a cancel within seconds from any state (it aborts a run Ray is
        # still starting); one that has not by now is not listening, and a cancel must take
        # effect all the same: its late events are then refused (the record ended).
        waited = (clock.now - r.cancel_requested_at).total_seconds()
        if waited > clock.cancel_grace_s:
            if r.state == JobState.assigned:
                reason = f"cancelled before worker {w} started it"
            else:
                reason = f"cancelled; worker {w} did not stop it in {clock.cancel_grace_s:g}s"
            return Overdue(r.job_id, w, "cancel", reason)
    if r.pause_requested and r.pause_requested_at is not None:
        # The worker checkpoints and hands the job back; one that has not by now does not
        # listen (or cannot): the job is taken back, and the requeue pauses it.
        waited = (clock.now - r.pause_requested_at).total_seconds()
        if waited > clock.pause_grace_s:
            reason = f"worker {w} did not hand it back within {clock.pause_grace_s:g}s"
            return Overdue(r.job_id, w, "requeue", reason)
    return None


def overdue(
    records: Iterable[JobRecord],
    clock: LeaseClock,
    *,
    alive: Callable[[str], bool],
    trust_absence: Callable[[str], bool],
    last_listed: Callable[[JobRecord], float],
) -> list[Overdue]:
    """Jobs to requeue (or, when a cancel was asked, to end; a job being paused is paused
    by its requeue).

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
        if (stop := _unanswered_stop(r, w, clock)) is not None:
            out.append(stop)
            continue
        if r.state == JobState.assigned:
            if r.assigned_at is not None:
                waited = (clock.now - r.assigned_at).total_seconds()
                if waited > clock.assign_timeout_s:
                    reason = f"worker {w} did not start it within {clock.assign_timeout_s:g}s"
                    out.append(Overdue(r.job_id, w, "requeue", reason))
        elif clock.mono - last_listed(r) > clock.assign_timeout_s:
            reason = f"worker {w} stopped listing it for {clock.assign_timeout_s:g}s"
            out.append(Overdue(r.job_id, w, "requeue", reason))
    return out

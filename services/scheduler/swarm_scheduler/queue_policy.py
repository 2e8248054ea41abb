"""The order in which queued jobs are considered: priority, then fair share, then FIFO.

Among queued jobs of equal priority the next one comes from the tenant with the fewest jobs
holding capacity (assigned or running), then the one served longest ago, then the oldest job:
a flood from one tenant is interleaved with everyone else's jobs instead of starving them.
An optional per-tenant limit keeps a tenant's extra jobs queued with a reason.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from swarm_contracts.jobs import JobRecord, JobState

_HOLDING = (JobState.assigned, JobState.running)
_NEVER = datetime.min.replace(tzinfo=UTC)


def queue_order(jobs: Iterable[JobRecord]) -> list[JobRecord]:
    """Higher priority first, then first come first served (no fairness)."""
    return sorted(jobs, key=lambda j: (-j.spec.priority, j.created_at, j.job_id))


class FairQueue:
    """Iterate queued jobs in fair-share order; call ``served`` for each one that was placed.

    ``jobs`` are the records that may hold capacity: they give each tenant's running count and
    its last service time (the latest ``assigned_at``), both read from the records so that a new
    leader continues the same policy. ``sessions``: each tenant's held training sessions
    (swarm_scheduler.session_leases), which count as running work too.
    """

    def __init__(
        self,
        queued: Iterable[JobRecord],
        jobs: Iterable[JobRecord],
        max_running: int = 0,
        sessions: Counter[str] | None = None,
    ) -> None:
        self.max_running = max_running
        self.running: Counter[str] = Counter(sessions or {})
        self.last_served: dict[str, datetime] = {}
        for job in jobs:
            if job.state in _HOLDING:
                self.running[job.tenant] += 1
            if job.assigned_at is not None:
                self.last_served[job.tenant] = max(
                    job.assigned_at, self.last_served.get(job.tenant, _NEVER)
                )
        self._serial = 0  # placements in this pass count as more recent than any record
        self._served_now: dict[str, int] = {}
        self.levels: dict[int, dict[str, deque[JobRecord]]] = {}
        for job in queue_order(queued):
            level = self.levels.setdefault(job.spec.priority, {})
            level.setdefault(job.tenant, deque()).append(job)

    def _key(self, tenant: str, head: JobRecord) -> tuple[object, ...]:
        return (
            self.running[tenant],
            self._served_now.get(tenant, 0),
            self.last_served.get(tenant, _NEVER),
            head.created_at,
            head.job_id,
        )

    def __iter__(self) -> Iterator[JobRecord]:
        for priority in sorted(self.levels, reverse=True):
            tenants = self.levels[priority]
            while tenants:
                tenant = min(tenants, key=lambda t: self._key(t, tenants[t][0]))
                job = tenants[tenant].popleft()
                if not tenants[tenant]:
                    del tenants[tenant]
                yield job

    def rank(
        self, tenant: str, since: datetime, name: str, priority: int = 0
    ) -> tuple[object, ...]:
        """Where work of ``tenant`` waiting since ``since`` stands in this order (lower comes
        first): how a training session waiting for room is weighed against the queued jobs."""
        return (
            -priority,
            self.running[tenant],
            self._served_now.get(tenant, 0),
            self.last_served.get(tenant, _NEVER),
            since,
            name,
        )

    def head_rank(self) -> tuple[object, ...] | None:
        """The rank of the job this queue serves first (None: no job is queued)."""
        if not self.levels:
            return None
        priority = max(self.levels)
        return min(
            self.rank(tenant, jobs[0].created_at, jobs[0].job_id, priority)
            for tenant, jobs in self.levels[priority].items()
        )

    def over_limit(self, job: JobRecord) -> str | None:
        """Why ``job`` must wait for its tenant's other jobs, or None."""
        if self.max_running and self.running[job.tenant] >= self.max_running:
            return (
                f"tenant {job.tenant} is at its limit of {self.max_running} running "
                f"job{'s' if self.max_running != 1 else ''}"
            )
        return None

    def served(self, job: JobRecord) -> None:
        self.running[job.tenant] += 1
        self._serial += 1
        self._served_now[job.tenant] = self._serial

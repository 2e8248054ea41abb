"""Training sessions' leases (the Tinker API, docs/tinker.md): room on a worker, held like a
job's assignment.

A session's model (a Tinker training client's) and optimizer live in one worker's agent for as
long as the client uses them. Its lease (``SessionLease``, KV bucket ``session_leases``) takes
room on that worker, which job placement then leaves alone, and counts against its tenant's
running work (the fair share's count and ``tenant_max_running``). The room is the worker's
session lane: the agent runs all its sessions' calls one at a time, on one CPU's worth of
threads (and one GPU, where it has GPUs, held in the agent's Ray), so the first lease on a
worker takes it and the others share it. The worker renews it by listing the session in its
heartbeats; a lease whose worker is lost, restarted, or has not listed it for
``assign_timeout_s`` ends, and so does one the gateway releases (the client closed the session,
or moves it off a lost worker). Each placement of a session is a new ``attempt``: the fencing
token its calls carry, and what a worker asks about (``holds``) before it writes to the store.

Only the leading scheduler places and releases; it reads the bucket when it takes over.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from swarm_contracts.jobs import JobSpec, utcnow
from swarm_contracts.sessions import (
    HeldSession,
    PlaceSession,
    ReleaseSession,
    SessionLease,
)
from swarm_contracts.workers import WorkerInfo
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused
from swarm_scheduler.placement import Capacity, Pool, held_back_text

# The session lane's room on a worker: the agent runs its sessions' calls one at a time, on one
# CPU's worth of threads, and on a worker with GPUs on one GPU (which swarm_trainer.session_lane
# holds in the agent's Ray).
SESSION_CPUS = 1


# A waiting session whose gateway has not asked again for this long (it asks every second) is
# given up, and a lease the scheduler made for a waiting session that its gateway has not
# taken in this long ends.
WAITING_FORGOTTEN_S = 3.0
# Where a waiting session stands among queued jobs of equal fair share: as a job of the default
# priority.
SESSION_PRIORITY: int = JobSpec.model_fields["priority"].default


@dataclass(frozen=True)
class Waiting:
    """A session refused room: its request, and when it was first refused and last asked."""

    request: PlaceSession
    since: datetime
    asked: float


def demand(worker: WorkerInfo) -> Capacity:
    return Capacity(SESSION_CPUS, 1 if worker.resources.gpus else 0)


class SessionLeases:
    def __init__(self, assign_timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.assign_timeout_s = assign_timeout_s
        self.clock = clock
        self.held: dict[str, tuple[SessionLease, int]] = {}  # session -> lease, KV revision
        # session -> (attempt, when a heartbeat of its worker last listed it, or when this
        # process first saw the lease): a lease ends when that is assign_timeout_s old.
        self._listed: dict[str, tuple[int, float]] = {}
        self._table: RecordTable[SessionLease] | None = None
        # Sessions refused for want of room, by session: the request, when it was first
        # refused (its place in the fair order beside queued jobs), and when last asked.
        self.waiting: dict[str, Waiting] = {}
        # Leases the scheduler made for waiting sessions that their gateway has not asked for
        # since: session -> when leased.
        self.unclaimed: dict[str, float] = {}

    @property
    def table(self) -> RecordTable[SessionLease]:
        assert self._table is not None, "load() first"
        return self._table

    async def load(self, table: RecordTable[SessionLease]) -> None:
        """Read the held leases (at start and on taking over): their renewals count from now."""
        self._table = table
        self.held = {}
        now = self.clock()
        for key in await table.keys():
            found = await table.get(key)
            if found is not None and found[0].state == "held":
                self.held[key] = found
                self._listed[key] = (found[0].attempt, now)

    # --- what placement of jobs must leave alone ---------------------------------------------

    def lanes(self) -> dict[str, Capacity]:
        """The room each worker's session lane takes (workers holding no session: none)."""
        out: dict[str, Capacity] = {}
        for lease, _ in self.held.values():
            out[lease.worker_id] = Capacity(lease.cpus, lease.gpus)
        return out

    def used(self, jobs: dict[str, Capacity]) -> dict[str, Capacity]:
        """``jobs`` (capacity jobs hold per worker) plus the session lanes'."""
        out = dict(jobs)
        for worker_id, lane in self.lanes().items():
            prev = out.get(worker_id, Capacity(0, 0))
            out[worker_id] = Capacity(prev.cpus + lane.cpus, prev.gpus + lane.gpus)
        return out

    def running(self) -> Counter[str]:
        """Held sessions per tenant: they count as running work in the fair share."""
        return Counter(lease.tenant for lease, _ in self.held.values())

    # --- the gateway's requests --------------------------------------------------------------

    async def place(
        self,
        request: PlaceSession,
        workers: Pool,
        jobs_used: dict[str, Capacity],
        tenant_running: Counter[str],
        max_running: int = 0,
        held_back: Iterable[WorkerInfo] = (),
        providers: bool = False,
        asked: bool = True,
    ) -> SessionLease:
        """Lease room for the session on a fitting worker (of the cluster's own unless
        ``providers``: a provider's is granted the session's store access with the request's
        token), ending its lease on ``avoid`` (moving it). Refused (``conflict``, with why)
        while nothing fits or its tenant is at its limit: the caller asks again later, and
        meanwhile the session is ``waiting`` (the scheduler may lease it room before it asks
        again: ``asked`` False, the scheduler's own try, which keeps it no longer waiting)."""
        try:
            lease = await self._place(
                request, workers, jobs_used, tenant_running, max_running, held_back, providers
            )
        except Refused:
            waited = self.waiting.get(request.session)
            if asked:
                first = min(request.waiting_since or utcnow(), utcnow())
                since = waited.since if waited is not None else first
                self.waiting[request.session] = Waiting(request, since, self.clock())
            raise
        self.waiting.pop(request.session, None)
        if asked:
            self.unclaimed.pop(request.session, None)
        elif lease.session not in self.unclaimed:
            self.unclaimed[lease.session] = self.clock()
        return lease

    def waiting_now(self) -> list[Waiting]:
        """The sessions waiting for room whose gateway still asks (it asks every second; one
        that stopped, its client gone, is forgotten)."""
        now = self.clock()
        for session, waited in list(self.waiting.items()):
            if now - waited.asked > WAITING_FORGOTTEN_S or session in self.held:
                del self.waiting[session]
        return list(self.waiting.values())

    async def _place(
        self,
        request: PlaceSession,
        workers: Pool,
        jobs_used: dict[str, Capacity],
        tenant_running: Counter[str],
        max_running: int,
        held_back: Iterable[WorkerInfo],
        providers: bool,
    ) -> SessionLease:
        current = self.held.get(request.session)
        if current is not None:
            if current[0].worker_id != request.avoid:
                # Asked twice (a retried request whose reply was lost): the lease it made, with
                # the token of this request, the one its caller will send.
                return await self._retoken(request, *current)
            await self.end(request.session, f"worker {request.avoid} was lost")  # moving
        running = tenant_running[request.tenant] + self.running()[request.tenant]
        if max_running and running >= max_running:
            raise Refused(
                f"tenant {request.tenant} is at its limit of {max_running} running "
                f"job{'s' if max_running != 1 else ''} (its training sessions count)",
                "conflict",
            )
        used, lanes = self.used(jobs_used), self.lanes()
        candidates = [
            w
            for w in workers.workers
            if (providers or (w.provider is None and not w.labels.get("provider")))
            and w.worker_id != request.avoid
        ]

        def left(w: WorkerInfo) -> Capacity:
            return workers.totals[w.worker_id] - used.get(w.worker_id, Capacity(0, 0))

        # A worker with a lane already takes another session in it; else the lane must fit.
        fitting = [w for w in candidates if w.worker_id in lanes or left(w).fits(demand(w))]
        if not fitting:
            raise Refused(self._why_not(candidates, list(held_back), providers), "conflict")

        def preference(w: WorkerInfo) -> tuple[object, ...]:
            # The base model already cached first; then a lane already open (no room taken);
            # then the least spare room (as jobs' best fit: big holes stay for big jobs); then
            # the faster.
            spare, cached = left(w), request.base_model.digest in w.cached_models
            opened = w.worker_id in lanes
            return (not cached, not opened, spare.gpus, spare.cpus, workers.rank(w.worker_id))

        worker = min(fitting, key=preference)
        need = demand(worker)
        attempt = 1
        found = await self.table.get(request.session)
        if found is not None:
            attempt = found[0].attempt + 1
        lease = SessionLease(
            session=request.session,
            tenant=request.tenant,
            worker_id=worker.worker_id,
            attempt=attempt,
            cpus=need.cpus,
            gpus=need.gpus,
            base_model=request.base_model,
            attempt_token_sha256=request.attempt_token_sha256,
        )
        # Compare-and-set: two leaders for a moment cannot both lease the same attempt.
        if found is None:
            revision = await self.table.create(request.session, lease)
        else:
            revision = await self.table.update(request.session, lease, found[1])
        self.held[request.session] = (lease, revision)
        self._listed[request.session] = (attempt, self.clock())
        return lease

    async def _retoken(
        self, request: PlaceSession, lease: SessionLease, revision: int
    ) -> SessionLease:
        if lease.attempt_token_sha256 == request.attempt_token_sha256:
            return lease
        lease = lease.model_copy(update={"attempt_token_sha256": request.attempt_token_sha256})
        self.held[request.session] = (
            lease,
            await self.table.update(request.session, lease, revision),
        )
        return lease

    @staticmethod
    def _why_not(candidates: list[WorkerInfo], held_back: list[WorkerInfo], providers: bool) -> str:
        if candidates:
            return f"waiting for {SESSION_CPUS} CPU to free up on a worker for the session"
        if held_back:
            return f"waiting for a worker: none takes new sessions ({held_back_text(held_back)})"
        if providers:
            return "waiting for a worker"
        return (
            "waiting for a worker of the cluster's own (providers' workers take no training "
            "sessions here)"
        )

    async def release(self, request: ReleaseSession) -> SessionLease:
        """End the lease of this attempt (the client closed the session): its record goes too,
        as nothing follows a close. A lease of another attempt is left as it is."""
        current = self.held.get(request.session)
        if current is None or current[0].attempt != request.attempt:
            found = await self.table.get(request.session)
            if found is None:
                raise Refused(f"no lease of session {request.session}", "not_found")
            return found[0]  # ended already, or moved on: nothing of this attempt to end
        ended = await self.end(request.session, request.reason)
        assert ended is not None
        await self.table.delete(request.session)
        return ended

    async def end(self, session: str, reason: str) -> SessionLease | None:
        """End the held lease: its room is free at once. The ended record stays, so that the
        gateway reads why and the next placement takes the next attempt."""
        current = self.held.pop(session, None)
        self._listed.pop(session, None)
        self.unclaimed.pop(session, None)
        if current is None:
            return None
        lease, revision = current
        ended = lease.model_copy(update={"state": "ended", "reason": reason, "ended_at": utcnow()})
        await self.table.update(session, ended, revision)
        return ended

    # --- renewal, and leases that lapse ------------------------------------------------------

    def listed_by(self, worker_id: str, sessions: Iterable[HeldSession], now: float) -> None:
        """Renew the leases ``worker_id`` holds and lists, at the attempt the lease has."""
        for s in sessions:
            held = self.held.get(s.session)
            if held is not None and held[0].worker_id == worker_id and held[0].attempt == s.attempt:
                self._listed[s.session] = (s.attempt, now)

    def lapsed(self, now: float, alive: Callable[[str], bool]) -> list[tuple[str, str]]:
        """The held leases to end, with why: their worker is gone, or stopped listing them, or
        the scheduler leased them while they waited and their gateway never took them."""
        out = []
        for session, (lease, _) in self.held.items():
            leased = self.unclaimed.get(session)
            if leased is not None and now - leased > WAITING_FORGOTTEN_S:
                out.append((session, "leased while it waited, but its gateway did not take it"))
                continue
            if not alive(lease.worker_id):
                out.append((session, f"worker {lease.worker_id} was lost"))
                continue
            attempt, at = self._listed.get(session, (lease.attempt, now))
            if attempt == lease.attempt and now - at > self.assign_timeout_s:
                out.append(
                    (
                        session,
                        f"worker {lease.worker_id} has not listed the session for "
                        f"{self.assign_timeout_s:.0f}s",
                    )
                )
        return out

    def of_worker(self, worker_id: str) -> list[str]:
        return [s for s, (lease, _) in self.held.items() if lease.worker_id == worker_id]

    async def holds(self, session: str, attempt: int, worker_id: str) -> bool:
        """Whether ``worker_id`` holds ``attempt`` of the session (from the bucket: any
        scheduler process answers)."""
        found = await self.table.get(session)
        lease = found[0] if found is not None else None
        return (
            lease is not None
            and lease.state == "held"
            and lease.attempt == attempt
            and lease.worker_id == worker_id
        )

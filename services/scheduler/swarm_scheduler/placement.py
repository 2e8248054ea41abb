"""Placement as pure functions: which queued job goes on which worker, and why not."""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.verification import VerifyTarget
from swarm_contracts.workers import WorkerInfo
from swarm_scheduler.queue_policy import FairQueue
from swarm_scheduler.speed import clearly_faster, measured_speed

# Which fitting worker a job goes to (SWARM_PLACEMENT_ORDER; see FreeIndex).
Order = Literal["best_fit", "fastest"]

# States in which a job holds capacity on its worker.
HOLDING = (JobState.assigned, JobState.running)
GB = 1 << 30


class Capacity(NamedTuple):
    # A tuple rather than a frozen dataclass: placement makes one per worker per pass, and a
    # tuple is several times cheaper to build, hash and compare.
    cpus: int
    gpus: int

    def fits(self, need: Capacity) -> bool:
        return self.cpus >= need.cpus and self.gpus >= need.gpus

    def __sub__(self, other: Capacity) -> Capacity:
        return Capacity(self.cpus - other.cpus, self.gpus - other.gpus)

    def describe(self) -> str:
        gpus = f", {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else ""
        return f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}{gpus}"


def demand(spec: JobSpec) -> Capacity:
    """All of a job's Ray workers run on one agent's cluster, so their needs add up."""
    r = spec.resources
    return Capacity(r.workers * r.cpus_per_worker, r.workers * r.gpus_per_worker)


def total(worker: WorkerInfo) -> Capacity:
    return Capacity(worker.resources.cpus, len(worker.resources.gpus))


def labels_match(worker: WorkerInfo, spec: JobSpec) -> bool:
    return all(worker.labels.get(k) == v for k, v in spec.resources.labels.items())


def big_enough_gpus(worker: WorkerInfo, min_gb: float) -> int:
    return sum(1 for g in worker.resources.gpus if g.memory_bytes >= min_gb * GB)


def min_gpu_gb(job: JobRecord) -> float:
    """The memory each of a GPU job's GPUs must have: what the spec asks for, or the job's
    estimated need (``JobRecord.memory``) when that is more."""
    asked = job.spec.resources.min_gpu_memory_gb
    if job.memory is None or not job.spec.resources.gpus_per_worker:
        return asked
    return max(asked, job.memory.total_bytes / GB)


def _eligible_by_id(
    by_id: dict[str, WorkerInfo],
    spec: JobSpec,
    min_gb: float,
    verify: VerifyTarget | None,
    worker_id: str,
) -> bool:
    worker = by_id[worker_id]
    return eligible(worker, spec, min_gb) and (verify is None or may_replay(worker, verify))


def provider_of(worker: WorkerInfo) -> str | None:
    """Who runs the worker: the provider it joined as, else its ``provider`` label."""
    return worker.provider or worker.labels.get("provider")


def may_replay(worker: WorkerInfo, target: VerifyTarget) -> bool:
    """A replay never runs on the worker whose training it checks, nor on another worker of
    the same provider (which could share its shortcuts)."""
    if worker.worker_id == target.worker_id:
        return False
    return target.provider is None or provider_of(worker) != target.provider


def eligible(worker: WorkerInfo, spec: JobSpec, min_gb: float | None = None) -> bool:
    """Whether ``worker`` could ever run the job, capacity in use aside.

    GPU memory is checked against the worker's GPU list: with ``min_gb`` (by default the spec's
    ``min_gpu_memory_gb``; see ``min_gpu_gb``) the worker needs as many big-enough GPUs as the
    job asks for. (Free GPUs are tracked as a count, so a worker mixing GPU sizes is treated as
    if its big ones were free first.)
    """
    if not labels_match(worker, spec):
        return False
    need = demand(spec).gpus
    if min_gb is None:
        min_gb = spec.resources.min_gpu_memory_gb
    return need == 0 or min_gb <= 0 or big_enough_gpus(worker, min_gb) >= need


def held(jobs: Iterable[JobRecord]) -> dict[str, Capacity]:
    """Capacity each worker's assigned and running jobs hold, in one pass over the jobs."""
    out: dict[str, Capacity] = {}
    for job in jobs:
        if job.worker_id and job.state in HOLDING:
            need = demand(job.spec)
            prev = out.get(job.worker_id, Capacity(0, 0))
            out[job.worker_id] = Capacity(prev.cpus + need.cpus, prev.gpus + need.gpus)
    return out


def free_capacity(worker: WorkerInfo, jobs: Iterable[JobRecord]) -> Capacity:
    """Total minus what the scheduler's own records put there.

    The records, not the heartbeat's ``free``, are the truth: a heartbeat lags behind an
    assignment, and trusting it would put two jobs in the same hole.
    """
    return total(worker) - held(jobs).get(worker.worker_id, Capacity(0, 0))


# How a worker ranks among workers of the same capacity: smaller first.
Rank = Callable[[str], tuple[float, str]]


def by_id(wid: str) -> tuple[float, str]:
    return (0.0, wid)


def _grouped(capacities: dict[str, Capacity], rank: Rank = by_id) -> dict[Capacity, list[str]]:
    """Worker ids by capacity, each group sorted by ``rank``."""
    groups: dict[Capacity, list[str]] = {}
    for wid in sorted(capacities, key=rank):
        groups.setdefault(capacities[wid], []).append(wid)
    return groups


class Pool:
    """The alive workers as placement sees them: by id, their total capacity, their measured
    speed (``speed``, from their self-benchmarks), their ids grouped by total capacity (each
    group faster first, then by id), and who holds which base model in its cache.

    The worker table keeps one until a worker comes, goes or changes its resources, labels or
    benchmark, so that a placement pass with a thousand workers does not rebuild it from every
    worker.
    """

    def __init__(self, workers: Iterable[WorkerInfo]) -> None:
        self.workers = list(workers)
        self.by_id = {w.worker_id: w for w in self.workers}
        self.totals = {w.worker_id: total(w) for w in self.workers}
        self.speed = {w.worker_id: measured_speed(w) for w in self.workers}
        # Worked out once: placement looks ranks up for every job it places.
        self.ranks = {wid: (-speed, wid) for wid, speed in self.speed.items()}
        self.rank: Rank = self.ranks.__getitem__
        self.groups = _grouped(self.totals, self.rank)
        # Base model digest -> the workers that advertise it cached, in rank order.
        self.holders: dict[str, list[str]] = {}
        for wid in sorted(self.by_id, key=self.rank):
            for digest in self.by_id[wid].cached_models:
                self.holders.setdefault(digest, []).append(wid)


class FreeIndex:
    """Workers grouped by their free capacity, each group sorted by rank (faster first, then
    worker id).

    Best fit then looks at each distinct free capacity once instead of at every worker: with a
    thousand workers and a burst of jobs, a scan per job was most of a placement pass.
    """

    def __init__(self, free: dict[str, Capacity], rank: Rank = by_id) -> None:
        self.free = dict(free)
        self.rank = rank
        self.groups = _grouped(self.free, rank)

    @classmethod
    def of_pool(cls, pool: Pool, used: dict[str, Capacity]) -> FreeIndex:
        """From a ``Pool``'s groups, moving only the workers that hold jobs."""
        index = cls.__new__(cls)
        index.free = dict(pool.totals)
        index.rank = pool.rank
        index.groups = {cap: list(ids) for cap, ids in pool.groups.items()}
        for wid, u in used.items():
            if wid in index.free:
                index.take(wid, u)
        return index

    def _fitting(
        self, need: Capacity, allowed: Callable[[str], bool] | None, holders: Sequence[str]
    ) -> Iterator[str]:
        """Per free capacity that fits, least spare room first (GPUs first, to limit
        fragmentation): its first allowed worker holding the job's base model in its cache
        (``holders``, in rank order), else its first allowed worker in rank order."""
        for cap in sorted(self.groups, key=lambda c: (c.gpus, c.cpus)):
            if cap.cpus < need.cpus or cap.gpus < need.gpus:
                continue
            # Cache tie-break: holders are few, so look them up rather than scan the group.
            held = (w for w in holders if self.free.get(w) == cap and (not allowed or allowed(w)))
            if (wid := next(held, None)) is not None:
                yield wid
                continue
            for wid in self.groups[cap]:
                if allowed is None or allowed(wid):
                    yield wid
                    break

    def best_fit(
        self,
        need: Capacity,
        allowed: Callable[[str], bool] | None = None,
        holders: Sequence[str] = (),
    ) -> str | None:
        """The allowed fitting worker left with the least spare room; among those, one of
        ``holders`` (holding the job's base model in its cache), then the fastest, then the
        smallest worker id."""
        return next(self._fitting(need, allowed, holders), None)

    def fastest(
        self,
        need: Capacity,
        allowed: Callable[[str], bool] | None = None,
        holders: Sequence[str] = (),
    ) -> str | None:
        """The fastest allowed fitting worker; a roomier one than the best fit only when it is
        clearly faster (``speed.FASTER_BY``), so that near-equal speeds keep best fit."""
        best: str | None = None
        best_speed = 0.0
        for wid in self._fitting(need, allowed, holders):
            speed = -self.rank(wid)[0]
            if best is None or clearly_faster(speed, best_speed):
                best, best_speed = wid, speed
        return best

    def take(self, wid: str, need: Capacity) -> None:
        old = self.free[wid]
        group = self.groups[old]
        del group[bisect.bisect_left(group, self.rank(wid), key=self.rank)]
        if not group:
            del self.groups[old]
        new = self.free[wid] = old - need
        bisect.insort(self.groups.setdefault(new, []), wid, key=self.rank)


def best_fit(need: Capacity, free: dict[str, Capacity]) -> str | None:
    """The fitting worker left with the least spare room (GPUs first), to limit fragmentation."""
    return FreeIndex(free).best_fit(need)


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def held_back_text(held_back: Sequence[WorkerInfo], shown: int = 5) -> str:
    """Why present workers take no new jobs: ``w2 cordoned, w3 suspect`` (the first few)."""

    def why(w: WorkerInfo) -> str:
        if w.state != "alive":
            return w.state  # leaving
        return "suspect" if w.suspect else "draining" if w.draining else "cordoned"

    named = sorted(held_back, key=lambda w: w.worker_id)
    text = ", ".join(f"{w.worker_id} {why(w)}" for w in named[:shown])
    return text + (f" and {len(named) - shown} more" if len(named) > shown else "")


def unplaceable_reason(
    spec: JobSpec,
    workers: list[WorkerInfo],
    min_gb: float | None = None,
    verify: VerifyTarget | None = None,
    held_back: Sequence[WorkerInfo] = (),
) -> str:
    """Why the job waits. ``workers`` are those placement may use; ``held_back`` the present
    workers it may not (leaving, or cordoned, drained or suspect): a job waiting only because
    of those says so, rather than that no worker is alive."""
    need = demand(spec)
    asked = spec.resources.min_gpu_memory_gb
    if min_gb is None:
        min_gb = asked
    if not workers:
        if held_back:
            return f"waiting for a worker: none takes new jobs ({held_back_text(held_back)})"
        return "waiting for a worker: none is alive"
    if verify is not None:
        workers = [w for w in workers if may_replay(w, verify)]
        if not workers:
            provider = f" or of provider {verify.provider}" if verify.provider else ""
            others = [w for w in held_back if may_replay(w, verify)]
            if others:
                return (
                    f"waiting for a worker to replay on: none takes new jobs but "
                    f"{verify.worker_id}{provider}, whose work it checks "
                    f"({held_back_text(others)})"
                )
            return (
                f"waiting for a worker to replay on: none is alive but {verify.worker_id}"
                f"{provider}, whose work it checks"
            )
    labelled = [w for w in workers if labels_match(w, spec)]
    if not labelled:
        return f"no alive worker has labels {_labels_text(spec.resources.labels)}"
    fitting = [w for w in labelled if eligible(w, spec, min_gb)]
    if not fitting:
        estimated = " (the job's estimated need)" if min_gb > asked else ""
        return (
            f"no alive worker has {need.gpus} GPU{'s' if need.gpus != 1 else ''} with "
            f"≥ {min_gb:.3g} GB of memory{estimated}"
        )
    if not any(total(w).fits(need) for w in fitting):
        largest = max(fitting, key=lambda w: (total(w).gpus, total(w).cpus))
        return (
            f"no worker can ever fit {need.describe()}: the largest is {largest.worker_id} "
            f"with {total(largest).describe()}"
        )
    return f"waiting for {need.describe()} to free up on a worker"


@dataclass
class Plan:
    placements: list[tuple[JobRecord, str]]
    waiting: dict[str, str]  # job id -> reason


def _shape(job: JobRecord) -> tuple[object, ...]:
    r = job.spec.resources
    # A replay excludes some workers: it fits where another job of its shape may not.
    excluded = (job.verify.worker_id, job.verify.provider) if job.verify else None
    return (demand(job.spec), min_gpu_gb(job), tuple(sorted(r.labels.items())), excluded)


def plan(
    queued: Iterable[JobRecord],
    workers: list[WorkerInfo] | Pool,
    jobs: Iterable[JobRecord],
    tenant_max_running: int = 0,
    used: dict[str, Capacity] | None = None,
    order: Order = "best_fit",
    held_back: Callable[[], Sequence[WorkerInfo]] = tuple,
    sessions: Counter[str] | None = None,
) -> Plan:
    """Place queued jobs in fair-share order (see ``queue_policy``) on the best-fitting worker,
    or with ``order="fastest"`` on the fastest fitting one; among equally fitting workers, one
    that holds the job's base model in its cache first.

    ``jobs`` are the records that may hold capacity (at least every assigned or running one).
    ``used`` is ``held(jobs)`` when the caller keeps it up to date already. ``held_back()``:
    the present workers placement may not use (cordoned, leaving, ...), asked for only to
    say why a job waits. ``sessions``: each tenant's held training sessions, running work in
    the fair share (their room is in ``used``).
    A job that does not fit is skipped, so a smaller one behind it can still go (backfill).
    """
    jobs = list(jobs)
    if used is None:
        used = held(jobs)
    pool = workers if isinstance(workers, Pool) else Pool(workers)
    workers, by_id = pool.workers, pool.by_id
    index = FreeIndex.of_pool(pool, used)
    pick = index.fastest if order == "fastest" else index.best_fit
    result = Plan([], {})
    # A shape that found no room once in this pass finds none later either: skip the scan.
    full: dict[tuple[object, ...], str] = {}
    kept_back: list[WorkerInfo] | None = None
    queue = FairQueue(queued, jobs, tenant_max_running, sessions)
    for job in queue:
        if (limit_reason := queue.over_limit(job)) is not None:
            result.waiting[job.job_id] = limit_reason
            continue
        shape = _shape(job)
        need = demand(job.spec)
        min_gb = min_gpu_gb(job)
        worker_id = None
        if shape not in full:
            simple = not job.spec.resources.labels and not (need.gpus and min_gb) and not job.verify
            allowed = functools.partial(_eligible_by_id, by_id, job.spec, min_gb, job.verify)
            holders = pool.holders.get(job.base_model.digest, ()) if job.base_model else ()
            worker_id = pick(need, None if simple else allowed, holders)
        if worker_id is None:
            if shape not in full:
                if kept_back is None:
                    kept_back = list(held_back())
                full[shape] = unplaceable_reason(job.spec, workers, min_gb, job.verify, kept_back)
            result.waiting[job.job_id] = full[shape]
            continue
        index.take(worker_id, need)
        queue.served(job)
        result.placements.append((job, worker_id))
    return result

"""Placement as pure functions: which queued job goes on which worker, and why not."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from swarm_common.jobs import JobRecord, JobSpec, JobState
from swarm_common.workers import WorkerInfo
from swarm_scheduler.queue_policy import FairQueue

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


def eligible(worker: WorkerInfo, spec: JobSpec) -> bool:
    """Whether ``worker`` could ever run the job, capacity in use aside.

    GPU memory is checked against the worker's GPU list: with ``min_gpu_memory_gb`` set, the
    worker needs as many big-enough GPUs as the job asks for. (Free GPUs are tracked as a count,
    so a worker mixing GPU sizes is treated as if its big ones were free first.)
    """
    if not labels_match(worker, spec):
        return False
    need = demand(spec).gpus
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


def _grouped(capacities: dict[str, Capacity]) -> dict[Capacity, list[str]]:
    """Worker ids by capacity, each group sorted."""
    groups: dict[Capacity, list[str]] = {}
    for wid in sorted(capacities):
        groups.setdefault(capacities[wid], []).append(wid)
    return groups


class Pool:
    """The alive workers as placement sees them: by id, their total capacity, and their ids
    grouped by total capacity (each group sorted).

    The worker table keeps one until a worker comes, goes or changes its resources or labels,
    so that a placement pass with a thousand workers does not rebuild it from every worker.
    """

    def __init__(self, workers: Iterable[WorkerInfo]) -> None:
        self.workers = list(workers)
        self.by_id = {w.worker_id: w for w in self.workers}
        self.totals = {w.worker_id: total(w) for w in self.workers}
        self.groups = _grouped(self.totals)


class FreeIndex:
    """Workers grouped by their free capacity, each group sorted by worker id.

    Best fit then looks at each distinct free capacity once instead of at every worker: with a
    thousand workers and a burst of jobs, a scan per job was most of a placement pass.
    """

    def __init__(self, free: dict[str, Capacity]) -> None:
        self.free = dict(free)
        self.groups = _grouped(self.free)

    @classmethod
    def of_pool(cls, pool: Pool, used: dict[str, Capacity]) -> FreeIndex:
        """From a ``Pool``'s groups, moving only the workers that hold jobs."""
        index = cls.__new__(cls)
        index.free = dict(pool.totals)
        index.groups = {cap: list(ids) for cap, ids in pool.groups.items()}
        for wid, u in used.items():
            if wid in index.free:
                index.take(wid, u)
        return index

    def best_fit(self, need: Capacity, allowed: Callable[[str], bool] | None = None) -> str | None:
        """The allowed fitting worker left with the least spare room (GPUs first, to limit
        fragmentation), then the smallest worker id."""
        for cap in sorted(self.groups, key=lambda c: (c.gpus, c.cpus)):
            if cap.cpus < need.cpus or cap.gpus < need.gpus:
                continue
            for wid in self.groups[cap]:
                if allowed is None or allowed(wid):
                    return wid
        return None

    def take(self, wid: str, need: Capacity) -> None:
        old = self.free[wid]
        group = self.groups[old]
        del group[bisect.bisect_left(group, wid)]
        if not group:
            del self.groups[old]
        new = self.free[wid] = old - need
        bisect.insort(self.groups.setdefault(new, []), wid)


def best_fit(need: Capacity, free: dict[str, Capacity]) -> str | None:
    """The fitting worker left with the least spare room (GPUs first), to limit fragmentation."""
    return FreeIndex(free).best_fit(need)


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def unplaceable_reason(spec: JobSpec, workers: list[WorkerInfo]) -> str:
    need = demand(spec)
    if not workers:
        return "waiting for a worker: none is alive"
    labelled = [w for w in workers if labels_match(w, spec)]
    if not labelled:
        return f"no alive worker has labels {_labels_text(spec.resources.labels)}"
    fitting = [w for w in labelled if eligible(w, spec)]
    if not fitting:
        return (
            f"no alive worker has {need.gpus} GPU{'s' if need.gpus != 1 else ''} with "
            f"≥ {spec.resources.min_gpu_memory_gb:g} GB of memory"
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


def _shape(spec: JobSpec) -> tuple[object, ...]:
    r = spec.resources
    return (demand(spec), r.min_gpu_memory_gb, tuple(sorted(r.labels.items())))


def plan(
    queued: Iterable[JobRecord],
    workers: list[WorkerInfo] | Pool,
    jobs: Iterable[JobRecord],
    tenant_max_running: int = 0,
    used: dict[str, Capacity] | None = None,
) -> Plan:
    """Place queued jobs in fair-share order (see ``queue_policy``) on the best-fitting worker.

    ``jobs`` are the records that may hold capacity (at least every assigned or running one).
    ``used`` is ``held(jobs)`` when the caller keeps it up to date already.
    A job that does not fit is skipped, so a smaller one behind it can still go (backfill).
    """
    jobs = list(jobs)
    if used is None:
        used = held(jobs)
    pool = workers if isinstance(workers, Pool) else Pool(workers)
    workers, by_id = pool.workers, pool.by_id
    index = FreeIndex.of_pool(pool, used)
    result = Plan([], {})
    # A shape that found no room once in this pass finds none later either: skip the scan.
    full: dict[tuple[object, ...], str] = {}
    queue = FairQueue(queued, jobs, tenant_max_running)
    for job in queue:
        if (limit_reason := queue.over_limit(job)) is not None:
            result.waiting[job.job_id] = limit_reason
            continue
        shape = _shape(job.spec)
        need = demand(job.spec)
        worker_id = None
        if shape not in full:
            simple = not job.spec.resources.labels and not (
                need.gpus and job.spec.resources.min_gpu_memory_gb
            )
            worker_id = index.best_fit(
                need, None if simple else lambda k, s=job.spec: eligible(by_id[k], s)
            )
        if worker_id is None:
            if shape not in full:
                full[shape] = unplaceable_reason(job.spec, workers)
            result.waiting[job.job_id] = full[shape]
            continue
        index.take(worker_id, need)
        queue.served(job)
        result.placements.append((job, worker_id))
    return result

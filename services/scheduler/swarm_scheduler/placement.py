"""Placement as pure functions: which queued job goes on which worker, and why not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from swarm_common.jobs import JobRecord, JobSpec, JobState
from swarm_common.workers import WorkerInfo
from swarm_scheduler.queue_policy import FairQueue

# States in which a job holds capacity on its worker.
HOLDING = (JobState.assigned, JobState.running)
GB = 1 << 30


@dataclass(frozen=True)
class Capacity:
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


def best_fit(need: Capacity, free: dict[str, Capacity]) -> str | None:
    """The fitting worker left with the least spare room (GPUs first), to limit fragmentation."""
    best: tuple[int, int, str] | None = None
    for wid, f in free.items():
        if f.cpus >= need.cpus and f.gpus >= need.gpus:
            key = (f.gpus - need.gpus, f.cpus - need.cpus, wid)
            if best is None or key < best:
                best = key
    return best[2] if best else None


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
    workers: list[WorkerInfo],
    jobs: Iterable[JobRecord],
    tenant_max_running: int = 0,
) -> Plan:
    """Place queued jobs in fair-share order (see ``queue_policy``) on the best-fitting worker.

    ``jobs`` are the records that may hold capacity (at least every assigned or running one).
    A job that does not fit is skipped, so a smaller one behind it can still go (backfill).
    """
    jobs = list(jobs)
    used = held(jobs)
    free = {w.worker_id: total(w) - used.get(w.worker_id, Capacity(0, 0)) for w in workers}
    by_id = {w.worker_id: w for w in workers}
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
            candidates = (
                free if simple else {k: v for k, v in free.items() if eligible(by_id[k], job.spec)}
            )
            worker_id = best_fit(need, candidates)
        if worker_id is None:
            if shape not in full:
                full[shape] = unplaceable_reason(job.spec, workers)
            result.waiting[job.job_id] = full[shape]
            continue
        free[worker_id] = free[worker_id] - need
        queue.served(job)
        result.placements.append((job, worker_id))
    return result

from datetime import timedelta
from typing import Any

from swarm_contracts.jobs import JobRecord, JobSpec, JobState, ResourceSpec, utcnow
from swarm_contracts.memory import GB, MemoryEstimate
from swarm_contracts.verification import VerifyTarget
from swarm_contracts.workers import Gpu, Resources, WorkerInfo
from swarm_scheduler.placement import (
    Capacity,
    best_fit,
    demand,
    free_capacity,
    may_replay,
    min_gpu_gb,
    plan,
)
from swarm_scheduler.queue_policy import queue_order


def spec(
    priority: int = 5,
    workers: int = 1,
    cpus: int = 1,
    gpus: int = 0,
    min_gpu_gb: float = 0,
    labels: dict[str, str] | None = None,
) -> JobSpec:
    return JobSpec(
        name="a",
        base_model="tiny",
        dataset="ds-0123456789abcdef",
        priority=priority,
        resources=ResourceSpec(
            workers=workers,
            cpus_per_worker=cpus,
            gpus_per_worker=gpus,
            min_gpu_memory_gb=min_gpu_gb,
            labels=labels or {},
        ),
    )


def job(job_id: str, age_s: int = 0, tenant: str = "t", **kw: Any) -> JobRecord:
    record = JobRecord(job_id=job_id, tenant=tenant, spec=spec(**kw))
    record.created_at = utcnow() - timedelta(seconds=age_s)
    return record


def worker(
    worker_id: str,
    cpus: int,
    gpus: int = 0,
    gpu_gb: int = 80,
    labels: dict[str, str] | None = None,
) -> WorkerInfo:
    res = Resources(
        cpus=cpus,
        memory_bytes=1 << 30,
        gpus=[Gpu(index=i, name="H100", memory_bytes=gpu_gb << 30) for i in range(gpus)],
    )
    return WorkerInfo(
        worker_id=worker_id,
        state="alive",
        resources=res,
        free=res,
        labels=labels or {},
        last_heartbeat=utcnow(),
    )


def test_demand_adds_up_all_ray_workers() -> None:
    assert demand(spec(workers=3, cpus=2, gpus=1)) == Capacity(6, 3)


def test_free_capacity_counts_only_holding_jobs_on_that_worker() -> None:
    w = worker("w1", cpus=8, gpus=2)
    running = job("job-1", cpus=3, gpus=1)
    running.state, running.worker_id = JobState.running, "w1"
    finished = job("job-2", cpus=4)
    finished.state, finished.worker_id = JobState.succeeded, "w1"
    elsewhere = job("job-3", cpus=4)
    elsewhere.state, elsewhere.worker_id = JobState.assigned, "w2"
    assert free_capacity(w, [running, finished, elsewhere]) == Capacity(5, 1)


def test_queue_order_is_priority_then_fifo() -> None:
    old_low = job("job-a", age_s=30, priority=1)
    new_high = job("job-b", age_s=1, priority=9)
    old_high = job("job-c", age_s=20, priority=9)
    assert [j.job_id for j in queue_order([old_low, new_high, old_high])] == [
        "job-c",
        "job-b",
        "job-a",
    ]


def test_best_fit_picks_the_tightest_worker() -> None:
    free = {"big": Capacity(16, 0), "small": Capacity(2, 0), "gpu": Capacity(4, 1)}
    assert best_fit(Capacity(2, 0), free) == "small"
    assert best_fit(Capacity(3, 0), free) == "gpu" or best_fit(Capacity(3, 0), free) == "big"
    # A CPU job must not take the GPU box when a CPU box fits: GPUs left over count first.
    assert best_fit(Capacity(3, 0), {"big": Capacity(16, 0), "gpu": Capacity(4, 1)}) == "big"
    assert best_fit(Capacity(1, 1), free) == "gpu"
    assert best_fit(Capacity(1, 2), free) is None


def test_plan_never_overcommits_a_worker() -> None:
    jobs = [job(f"job-{i}", age_s=10 - i, cpus=1) for i in range(3)]
    result = plan(jobs, [worker("w1", cpus=2)], jobs)
    assert [(j.job_id, w) for j, w in result.placements] == [("job-0", "w1"), ("job-1", "w1")]
    assert result.waiting == {"job-2": "waiting for 1 CPU to free up on a worker"}


def test_plan_gives_a_readable_reason_when_nothing_can_ever_fit() -> None:
    big = job("job-big", gpus=2)
    result = plan([big], [worker("w1", cpus=4, gpus=1)], [big])
    assert result.placements == []
    assert result.waiting["job-big"] == (
        "no worker can ever fit 1 CPU, 2 GPUs: the largest is w1 with 4 CPUs, 1 GPU"
    )
    assert plan([big], [], [big]).waiting["job-big"] == "waiting for a worker: none is alive"


def test_plan_places_higher_priority_first_when_room_is_short() -> None:
    low = job("job-low", age_s=100, priority=1, cpus=2)
    high = job("job-high", age_s=1, priority=9, cpus=2)
    result = plan([low, high], [worker("w1", cpus=2)], [low, high])
    assert [j.job_id for j, _ in result.placements] == ["job-high"]
    assert "job-low" in result.waiting


def test_label_constraints_must_all_match() -> None:
    eu = job("job-eu", labels={"region": "eu", "provider": "acme"})
    workers = [
        worker("us", cpus=8, labels={"region": "us", "provider": "acme"}),
        worker("eu-other", cpus=8, labels={"region": "eu", "provider": "other"}),
        worker("eu-acme", cpus=8, labels={"region": "eu", "provider": "acme", "x": "y"}),
    ]
    assert [(j.job_id, w) for j, w in plan([eu], workers, [eu]).placements] == [
        ("job-eu", "eu-acme")
    ]
    nowhere = plan([eu], workers[:2], [eu])
    assert nowhere.waiting["job-eu"] == "no alive worker has labels provider=acme,region=eu"


def test_min_gpu_memory_picks_a_worker_with_big_enough_gpus() -> None:
    big_job = job("job-big", gpus=2, min_gpu_gb=40)
    small = worker("small", cpus=8, gpus=4, gpu_gb=24)
    large = worker("large", cpus=8, gpus=2, gpu_gb=80)
    assert plan([big_job], [small, large], [big_job]).placements[0][1] == "large"
    # The small-GPU box has more GPUs, yet none is big enough: the reason says which need.
    assert plan([big_job], [small], [big_job]).waiting["job-big"] == (
        "no alive worker has 2 GPUs with ≥ 40 GB of memory"
    )
    # Without the memory floor the tighter fit wins... which is the 2-GPU box (no GPU left).
    any_gpu = job("job-any", gpus=2)
    assert plan([any_gpu], [small, large], [any_gpu]).placements[0][1] == "large"


def estimated(job_record: JobRecord, gb: float) -> JobRecord:
    record = job_record.model_copy()
    record.memory = MemoryEstimate(
        base_model="llama@1",
        tokens=1024,
        weights_bytes=int(gb * GB),
        lora_bytes=0,
        lora_parameters=0,
        activations_bytes=0,
        logits_bytes=0,
        runtime_bytes=0,
        total_bytes=int(gb * GB),
    )
    return record


def test_a_gpu_jobs_memory_estimate_is_its_minimum_gpu_memory() -> None:
    needy = estimated(job("job-needy", gpus=1), 50)
    small = worker("small", cpus=8, gpus=4, gpu_gb=24)
    large = worker("large", cpus=8, gpus=1, gpu_gb=80)
    assert plan([needy], [small, large], [needy]).placements == [(needy, "large")]
    assert plan([needy], [small], [needy]).waiting["job-needy"] == (
        "no alive worker has 1 GPU with ≥ 50 GB of memory (the job's estimated need)"
    )
    # An explicit floor above the estimate wins; one below it does not lower it.
    asking = estimated(job("job-asking", gpus=1, min_gpu_gb=70), 50)
    assert min_gpu_gb(asking) == 70
    assert min_gpu_gb(estimated(job("job-low", gpus=1, min_gpu_gb=10), 50)) == 50
    # A CPU job is not held to a GPU estimate.
    cpu_job = estimated(job("job-cpu"), 50)
    assert min_gpu_gb(cpu_job) == 0
    assert plan([cpu_job], [worker("cpu", cpus=2)], [cpu_job]).placements[0][1] == "cpu"


def test_a_multi_worker_job_needs_one_agent_that_fits_all_its_workers() -> None:
    wide = job("job-wide", workers=3, cpus=2)  # 6 CPUs on one agent's cluster
    result = plan([wide], [worker("a", cpus=4), worker("b", cpus=4)], [wide])
    assert result.placements == []  # 8 CPUs in total, but never split across agents
    assert result.waiting["job-wide"].startswith("no worker can ever fit 6 CPUs")
    assert plan([wide], [worker("a", cpus=4), worker("c", cpus=6)], [wide]).placements[0][1] == (
        "c"
    )


def test_placement_skips_a_job_that_does_not_fit_and_backfills_a_smaller_one() -> None:
    big = job("job-big", age_s=10, cpus=4)
    small = job("job-small", age_s=1, cpus=1)
    busy = job("job-busy", cpus=2)
    busy.state, busy.worker_id = JobState.running, "w1"
    result = plan([big, small], [worker("w1", cpus=4)], [big, small, busy])
    assert [j.job_id for j, _ in result.placements] == ["job-small"]
    assert result.waiting["job-big"] == "waiting for 4 CPUs to free up on a worker"


def test_a_replay_goes_neither_to_the_worker_it_checks_nor_to_its_provider() -> None:
    replay = job("job-r")
    replay.verify = VerifyTarget(
        job_id="job-t", attempt=1, worker_id="w1", provider="acme", from_step=4, to_step=6
    )
    same = worker("w1", cpus=8)
    sibling = worker("w2", cpus=8, labels={"provider": "acme"})
    other = worker("w3", cpus=1, labels={"provider": "globex"})
    assert not may_replay(same, replay.verify)
    assert not may_replay(sibling, replay.verify)
    assert may_replay(other, replay.verify)

    # The best fit would be w1 or w2 (more room is no worse here); w3 gets it. An ordinary
    # job of the same shape in the same pass still goes to w1.
    result = plan([replay, job("job-o", age_s=-1)], [same, sibling, other], [])
    assert {j.job_id: w for j, w in result.placements} == {"job-r": "w3", "job-o": "w1"}

    alone = plan([replay], [same, sibling], [])
    assert alone.placements == []
    assert "none is alive but w1 or of provider acme" in alone.waiting["job-r"]


def test_a_job_waiting_only_for_held_back_workers_says_so() -> None:
    """Issue 21: a replay whose only other worker was cordoned read "none is alive"."""
    replay = job("job-r")
    replay.verify = VerifyTarget(job_id="job-t", attempt=1, worker_id="w1", from_step=4, to_step=6)
    cordoned = worker("w2", cpus=8).model_copy(update={"cordoned": True})
    suspect = worker("w3", cpus=8).model_copy(update={"cordoned": True, "suspect": True})
    leaving = worker("w4", cpus=8).model_copy(update={"state": "leaving"})
    alone = plan([replay], [worker("w1", cpus=8)], [], held_back=lambda: [cordoned])
    reason = alone.waiting["job-r"]
    assert "none is alive" not in reason
    assert reason == (
        "waiting for a worker to replay on: none takes new jobs but w1, whose work it checks "
        "(w2 cordoned)"
    )
    nobody = plan([job("job-a")], [], [], held_back=lambda: [leaving, suspect, cordoned])
    assert nobody.waiting["job-a"] == (
        "waiting for a worker: none takes new jobs (w2 cordoned, w3 suspect, w4 leaving)"
    )
    # Without any, the reason is as before.
    assert plan([job("job-a")], [], []).waiting["job-a"] == "waiting for a worker: none is alive"

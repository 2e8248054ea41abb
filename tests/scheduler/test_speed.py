"""Self-benchmarks in the scheduler: placement by speed (``SWARM_PLACEMENT_ORDER``) and the
``slow`` flag of a worker measuring far below what it advertises."""

from __future__ import annotations

from swarm_contracts.jobs import JobState, utcnow
from swarm_contracts.workers import Gpu, Heartbeat, Resources, WorkerBenchmark, WorkerInfo
from swarm_scheduler.placement import plan
from swarm_scheduler.speed import flags, gpu_tflops
from swarm_scheduler.worker_table import WorkerTable

from .test_placement import job


def bench(tflops: float, busy: bool = False) -> WorkerBenchmark:
    return WorkerBenchmark(
        matmul_tflops=tflops,
        train_tokens_per_s=1000.0,
        device="cuda:0",
        dtype="bfloat16",
        busy=busy,
        duration_s=1.0,
    )


def gpus(n: int, name: str = "NVIDIA H100 80GB HBM3") -> list[Gpu]:
    return [Gpu(index=i, name=name, memory_bytes=80 << 30) for i in range(n)]


def worker(worker_id: str, cpus: int, n_gpus: int = 0, tflops: float | None = None) -> WorkerInfo:
    res = Resources(cpus=cpus, memory_bytes=1 << 30, gpus=gpus(n_gpus))
    return WorkerInfo(
        worker_id=worker_id,
        state="alive",
        resources=res,
        free=res,
        last_heartbeat=utcnow(),
        benchmark=bench(tflops) if tflops is not None else None,
    )


def heartbeat(
    worker_id: str = "w1",
    tflops: float | None = None,
    gpu: str | None = None,
    advertised: float | None = None,
    busy: bool = False,
) -> Heartbeat:
    res = Resources(cpus=8, memory_bytes=1 << 30, gpus=gpus(1, gpu) if gpu else [])
    return Heartbeat(
        worker_id=worker_id,
        resources=res,
        free=res,
        benchmark=bench(tflops, busy) if tflops is not None else None,
        advertised_tflops=advertised,
    )


def placed(order: str, workers: list[WorkerInfo], **job_kw: object) -> str:
    queued = job("job-1", **job_kw)  # type: ignore[arg-type]
    result = plan([queued], workers, [queued], order=order)  # type: ignore[arg-type]
    [(_, worker_id)] = result.placements
    return worker_id


def test_fastest_order_prefers_the_faster_fitting_worker_over_the_tighter_fit() -> None:
    tight_slow = worker("a-tight", cpus=2, tflops=10)
    roomy_fast = worker("b-roomy", cpus=16, tflops=100)
    too_small_fastest = worker("c-small", cpus=1, tflops=1000)
    workers = [tight_slow, roomy_fast, too_small_fastest]
    assert placed("fastest", workers, cpus=2) == "b-roomy"
    # best_fit keeps today's behaviour: the tightest fit, whatever its speed.
    assert placed("best_fit", workers, cpus=2) == "a-tight"


def test_equally_fitting_workers_go_faster_first_in_either_order() -> None:
    # Same free capacity: the id used to decide; now the benchmark does.
    workers = [worker("a", cpus=4, tflops=5), worker("b", cpus=4, tflops=50), worker("c", cpus=4)]
    assert placed("best_fit", workers) == "b"
    assert placed("fastest", workers) == "b"


def test_unmeasured_workers_go_last_and_near_equal_speeds_leave_it_to_best_fit() -> None:
    assert placed("fastest", [worker("a", cpus=2), worker("b", cpus=16, tflops=0.05)]) == "b"
    # 100 vs 110 TFLOP/s is measurement noise on one GPU model: the tighter fit wins...
    near = [worker("roomy", cpus=16, tflops=110), worker("tight", cpus=2, tflops=100)]
    assert placed("fastest", near) == "tight"
    # ... and among equally fitting workers the faster one still goes first.
    assert (
        placed("fastest", [worker("a", cpus=2, tflops=100), worker("b", cpus=2, tflops=101)]) == "b"
    )
    # Clearly faster, but the fastest of all does not fit: the clearly faster fitting one.
    many = [
        worker("tight", cpus=2, tflops=100),
        worker("mid", cpus=4, tflops=110),
        worker("roomy", cpus=8, tflops=200),
        worker("tiny", cpus=1, tflops=900),
    ]
    assert placed("fastest", many, cpus=2) == "roomy"


def test_fastest_order_keeps_labels_gpu_memory_and_capacity_in_use() -> None:
    busy_fast = worker("fast", cpus=8, n_gpus=1, tflops=900)
    slow = worker("slow", cpus=8, n_gpus=1, tflops=200)
    running = job("job-0", gpus=1)
    running.state, running.worker_id = JobState.running, "fast"
    queued = [job("job-1", gpus=1), job("job-2", gpus=1)]
    result = plan(queued, [busy_fast, slow], [running, *queued], order="fastest")
    # The fast worker's only GPU is taken: the job goes to the slow one, the next one waits.
    assert [(j.job_id, w) for j, w in result.placements] == [("job-1", "slow")]
    assert "job-2" in result.waiting

    # Placing one job makes room scarcer on that worker: the next goes where it still fits.
    two = [job("job-a", cpus=4), job("job-b", cpus=4)]
    result = plan(two, [worker("f", cpus=4, tflops=900), worker("s", cpus=4, tflops=9)], two,
                  order="fastest")  # fmt: skip
    assert sorted(w for _, w in result.placements) == ["f", "s"]


def test_gpu_models_are_looked_up_by_their_driver_names() -> None:
    assert gpu_tflops("NVIDIA H100 80GB HBM3") == 989
    assert gpu_tflops("NVIDIA H100 PCIe") == 756
    assert gpu_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert gpu_tflops("NVIDIA L40S") == 362
    assert gpu_tflops("NVIDIA L4") == 121
    assert gpu_tflops("Tesla T4") == 65
    assert gpu_tflops("NVIDIA A10G") is None  # not A10: no guess rather than a wrong one
    assert gpu_tflops("Some Future GPU") is None


def test_a_worker_far_below_its_gpu_model_or_its_advertised_speed_is_flagged_slow() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert flags(heartbeat(tflops=650, gpu=h100), 0.3) == []
    # An "H100" doing A10 speed: a throttled, shared or misreported GPU.
    assert flags(heartbeat(tflops=80, gpu=h100), 0.3) == ["slow"]
    assert flags(heartbeat(tflops=80, gpu=h100), 0.05) == []
    # Measured while running jobs (an on-demand rerun): a shared device is not evidence.
    assert flags(heartbeat(tflops=80, gpu=h100, busy=True), 0.3) == []
    # What the provider advertises wins over the datasheet, and covers CPU-only workers.
    assert flags(heartbeat(tflops=0.05, advertised=1.0), 0.3) == ["slow"]
    assert flags(heartbeat(tflops=0.5, advertised=1.0), 0.3) == []
    assert flags(heartbeat(tflops=200, gpu=h100, advertised=250), 0.3) == []
    # Nothing promised (a CPU worker, an unknown GPU), or nothing measured: no flag.
    assert flags(heartbeat(tflops=0.01), 0.3) == []
    assert flags(heartbeat(tflops=0.01, gpu="Some Future GPU"), 0.3) == []
    assert flags(heartbeat(gpu=h100), 0.3) == []


def test_the_worker_table_keeps_benchmark_and_flags_and_replans_when_they_change() -> None:
    table = WorkerTable(timeout_s=10, slow_fraction=0.3)
    slow = heartbeat(tflops=80, gpu="NVIDIA H100 80GB HBM3")
    info, _ = table.heartbeat(slow)
    assert info.benchmark is not None
    assert info.benchmark.matmul_tflops == 80
    assert info.flags == ["slow"]
    pool = table.pool()
    # The next heartbeat carries the same measurement: nothing to replan.
    again = Heartbeat.model_validate_json(slow.model_dump_json())
    assert table.heartbeat(again)[0].flags == ["slow"]
    assert table.pool() is pool
    # Measured again (on request), now healthy: the flag goes and placement sees the speed.
    info, _ = table.heartbeat(heartbeat(tflops=700, gpu="NVIDIA H100 80GB HBM3"))
    assert info.flags == []
    assert table.pool() is not pool
    assert table.pool().speed["w1"] == 700

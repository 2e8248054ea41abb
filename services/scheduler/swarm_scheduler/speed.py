"""What a worker's self-benchmark tells the scheduler: how fast it is for placement, and whether
it measures far below what it advertises (flagged ``slow``)."""

from __future__ import annotations

import re

from swarm_contracts.workers import Heartbeat, Resources, WorkerInfo

# Datasheet dense tensor TFLOP/s, without sparsity, in the dtype the benchmark uses on that GPU
# (bf16; fp16 on V100 and T4, which have no bf16). First match wins: specific names first. A
# healthy GPU measures well over half of it with the benchmark's 8192² matmuls.
GPU_TFLOPS: tuple[tuple[re.Pattern[str], float], ...] = tuple(
    (re.compile(pattern, re.I), tflops)
    for pattern, tflops in (
        (r"\bH100\b.*\bPCIe\b", 756.0),
        (r"\bH100\b.*\bNVL\b", 835.0),
        (r"\b(GH200|H200|H100)\b", 989.0),
        (r"\bA100\b", 312.0),
        (r"\bL40S\b", 362.0),
        (r"\bL40\b", 181.0),
        (r"\bL4\b", 121.0),
        (r"\bA10\b", 125.0),
        (r"\bRTX 4090\b", 165.0),
        (r"\bRTX 3090\b", 71.0),
        (r"\bV100\b", 125.0),
        (r"\bT4\b", 65.0),
    )
)
# With SWARM_PLACEMENT_ORDER=fastest a job goes to a roomier worker than the best fit only when
# that one measured this many times faster: two measurements of the same GPU model differ by
# noise, and noise must not undo best fit's packing.
FASTER_BY = 1.25


def gpu_tflops(name: str) -> float | None:
    """The datasheet TFLOP/s of a GPU model, from the name its driver reports."""
    for pattern, tflops in GPU_TFLOPS:
        if pattern.search(name):
            return tflops
    return None


def expected_tflops(resources: Resources, advertised: float | None) -> float | None:
    """What the worker should measure: what its provider advertises, else its first GPU's
    datasheet figure (the benchmark runs on the first GPU); None when nothing is promised."""
    if advertised:
        return advertised
    if resources.gpus:
        return gpu_tflops(resources.gpus[0].name)
    return None


def flags(heartbeat: Heartbeat, slow_fraction: float) -> list[str]:
    """``["slow"]`` when the worker's benchmark, measured while idle, is below ``slow_fraction``
    of what it should reach."""
    bench = heartbeat.benchmark
    if bench is None or bench.busy:
        return []
    expected = expected_tflops(heartbeat.resources, heartbeat.advertised_tflops)
    if expected is not None and bench.matmul_tflops < slow_fraction * expected:
        return ["slow"]
    return []


def measured_speed(worker: WorkerInfo) -> float:
    """Placement's speed of a worker: its benchmark's TFLOP/s, 0 (slowest) when unmeasured."""
    return worker.benchmark.matmul_tflops if worker.benchmark is not None else 0.0


def clearly_faster(speed: float, than: float) -> bool:
    return speed > than * FASTER_BY

"""What this worker offers: CPUs, memory and GPUs, for heartbeats and the local Ray cluster."""

from __future__ import annotations

import os

import psutil

from swarm_contracts.workers import Gpu, Resources


def detect_cpus(override: int | None = None) -> int:
    if override:
        return override
    env = os.environ.get("SWARM_TRAINER_CPUS")
    if env:
        return int(env)
    return os.cpu_count() or 1


def detect_gpus() -> list[Gpu]:
    import torch  # seconds to import: the agent heartbeats before (TrainerAgent.prepare)

    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(Gpu(index=index, name=props.name, memory_bytes=props.total_memory))
    return gpus


def detect_resources(cpus: int | None = None, gpus: bool = True) -> Resources:
    """``gpus=False``: without looking for GPUs (which needs torch)."""
    return Resources(
        cpus=detect_cpus(cpus),
        memory_bytes=psutil.virtual_memory().total,
        gpus=detect_gpus() if gpus else [],
    )

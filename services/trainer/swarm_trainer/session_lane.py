"""The GPU a worker's training sessions run on, held in the agent's own Ray.

The scheduler counts a worker's session lane as one CPU and, on a worker with GPUs, one GPU
taken (swarm_scheduler.session_leases), and places jobs in the rest. The sessions run in the
agent's process, outside Ray, so Ray would hand that GPU to a job's rank as readily as any
other. While the worker holds sessions, an actor of the agent's Ray holds one CPU and one GPU
for them (``LaneHolder``): Ray gives no job that GPU, and the sessions run on the device Ray
chose for the actor. The actor goes when the last session does.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from swarm_runtime.rpc import Refused

log = logging.getLogger(__name__)

# How long a session's create waits for Ray to free a GPU (a job's rank that is ending).
GPU_WAIT_S = 60.0


def visible_index(gpu_id: str, visible: str | None) -> int:
    """The CUDA index, in this process, of the GPU Ray calls ``gpu_id``: its position in this
    process's ``CUDA_VISIBLE_DEVICES`` where that is set (Ray's ids are of that list), else
    the id itself."""
    if not visible:
        return int(gpu_id)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if gpu_id not in ids:
        raise ValueError(f"Ray's GPU {gpu_id} is not among CUDA_VISIBLE_DEVICES={visible}")
    return ids.index(gpu_id)


class GpuLane:
    def __init__(self) -> None:
        self._holder: Any = None
        self._device: str | None = None
        self._lock = threading.Lock()

    def device(self) -> str:
        """The lane's device (``cuda:<i>``), reserved in Ray on first use."""
        with self._lock:
            if self._device is None:
                self._holder, gpu_id = _reserve()
                index = visible_index(gpu_id, os.environ.get("CUDA_VISIBLE_DEVICES"))
                self._device = f"cuda:{index}"
                log.info("training sessions run on %s (Ray's GPU %s)", self._device, gpu_id)
            return self._device

    def release(self) -> None:
        """The worker holds no session now: the GPU is Ray's to give a job again."""
        with self._lock:
            if self._holder is None:
                return
            import ray

            ray.kill(self._holder)
            self._holder = self._device = None
            log.info("training sessions' GPU released")


def _reserve() -> tuple[Any, str]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1, num_gpus=1)
    class LaneHolder:
        def gpu(self) -> str:
            return str(ray.get_gpu_ids()[0])

    # On this machine: the sessions run in this process (an agent joined to a Ray cluster
    # of several nodes must not hold another node's GPU).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    holder = LaneHolder.options(scheduling_strategy=here).remote()  # type: ignore[attr-defined]
    try:
        return holder, ray.get(holder.gpu.remote(), timeout=GPU_WAIT_S)
    except ray.exceptions.GetTimeoutError as exc:
        ray.kill(holder)
        raise Refused(
            f"no GPU of this worker's came free for the session lane in {GPU_WAIT_S:.0f}s",
            "internal",
        ) from exc

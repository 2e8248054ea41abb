"""Ray Train's torch backend, set up by processes that never import torch.

Ray's ``TorchConfig`` lives in a module that imports torch, so every process that unpickles it
imports torch too: each attempt's Ray Train controller (an actor, a process of its own, for
which torch is a second and a half of its four CPU-seconds) and, through ``ray.train.torch``,
the agent that starts the run. ``TorchBackendConfig`` sets up the same process group (gloo on
CPUs, NCCL on GPUs, ``env://`` rendezvous at rank 0's address) with Ray's own worker-side
steps, imported where they run: on the ranks, which import torch anyway. No TPU backend:
Swarm places no TPU jobs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30


@dataclass
class TorchBackendConfig(BackendConfig):
    """``ray.train.torch.TorchConfig`` as Swarm uses it: ``backend`` None picks NCCL for a run
    on GPUs, gloo otherwise."""

    backend: str | None = None
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return _TorchBackend

    @property
    def train_func_context(self) -> type[_DeviceContext]:
        return _DeviceContext

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "timeout_s": self.timeout_s}


class _TorchBackend(Backend):
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: TorchBackendConfig) -> None:
        gpus = worker_group.get_resources_per_worker().get("GPU", 0)
        backend = backend_config.backend or ("nccl" if gpus > 0 else "gloo")
        address, port = worker_group.execute_single(0, rendezvous_address)
        worker_group.execute(_set_env, address=address, port=port)
        size = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _init_process_group,
                    backend=backend,
                    world_rank=rank,
                    world_size=size,
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(size)
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: TorchBackendConfig) -> None:
        futures = worker_group.execute_async(_shutdown, destroy=len(worker_group) > 1)
        try:
            ray.get(futures, timeout=SHUTDOWN_TIMEOUT_S)
        except GetTimeoutError:
            log.warning("torch process group shutdown timed out after %s s", SHUTDOWN_TIMEOUT_S)


# --- on the ranks ---------------------------------------------------------------------------


class _DeviceContext:
    """Around the training function: the rank's CUDA device made the current one."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc: object) -> None:
        pass


# Where the process group's rendezvous port is drawn from: below the kernel's ephemeral range
# (and below the test suite's own ports).
RENDEZVOUS_PORTS = range(10000, 20000)


def rendezvous_address() -> tuple[str, int]:
    """Rank 0's address and a free port for the group's rendezvous (its TCP store), which rank
    0 binds a few seconds later. Ray's ``get_address_and_port`` binds port 0, and so gets a
    port of the ephemeral range, which any outgoing connection on the machine may take in the
    meantime (seen under load: the store failed with EADDRINUSE); none takes one below it."""
    import random
    import socket

    for _ in range(100):
        port = random.choice(RENDEZVOUS_PORTS)
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return ray.util.get_node_ip_address(), port
    return get_address_and_port()


def _set_env(address: str, port: int) -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()  # RANK, WORLD_SIZE, LOCAL_RANK, ... as torchrun sets them


def _init_process_group(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(
        backend=backend,
        world_rank=world_rank,
        world_size=world_size,
        init_method="env://",
        timeout_s=timeout_s,
    )


def _shutdown(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)

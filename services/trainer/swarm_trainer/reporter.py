"""Rank 0's end of the channels to the agent (see ``control``): reports out, cancel in."""

from __future__ import annotations

import contextlib
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.util.queue import Full, Queue

from swarm_trainer import reports
from swarm_trainer.step import all_reduce_sum


class Reporter:
    """Other ranks hold one that sends nothing."""

    def __init__(self, queue: Queue | None, control: Any | None, rank: int) -> None:
        self.queue = queue if rank == 0 else None
        self.control = control

    def send(self, report: reports.Report) -> None:
        if self.queue is None:
            return
        # A progress report is dropped when the queue is full rather than stall training;
        # the others wait for room (they are few).
        blocking = not isinstance(report, reports.Progress)
        with contextlib.suppress(Full):
            self.queue.put(report, block=blocking, timeout=10)

    def cancelled(self, device: torch.device) -> bool:
        return self.stop_mode(device) != 0

    def stop_mode(self, device: torch.device) -> int:
        """Rank 0 reads the flag (``control.CANCEL``, ``control.RELEASE`` or 0) and every rank
        gets its answer, so all stop on one step (the other ranks add 0)."""
        mode = 0.0
        if self.queue is not None and self.control is not None:
            mode = float(ray.get(self.control.stop_mode.remote()))
        return int(all_reduce_sum([mode], device)[0]) if dist.is_initialized() else int(mode)

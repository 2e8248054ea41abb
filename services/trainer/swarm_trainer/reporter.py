"""Rank 0's end of the channel to the agent (see ``control``): reports out, cancel in."""

from __future__ import annotations

from typing import Any

import ray
import torch
import torch.distributed as dist

from swarm_trainer import reports
from swarm_trainer.step import all_reduce_sum


class Reporter:
    """Other ranks hold one that sends nothing."""

    def __init__(self, control: Any | None, rank: int) -> None:
        self.control = control
        self.rank = rank

    def send(self, report: reports.Report) -> None:
        if self.control is None or self.rank != 0:
            return
        # Waited for (a few ms): the reports arrive in order, and rank 0 cannot outrun the
        # agent by more than the queue.
        ray.get(self.control.put(report))

    def cancelled(self, device: torch.device) -> bool:
        return self.stop_mode(device) != 0

    def stop_mode(self, device: torch.device) -> int:
        """Rank 0 reads the flag (``control.CANCEL``, ``control.RELEASE`` or 0) and every rank
        gets its answer, so all stop on one step (the other ranks add 0)."""
        mode = 0.0
        if self.control is not None and self.rank == 0:
            mode = float(ray.get(self.control.stop_mode()))
        return int(all_reduce_sum([mode], device)[0]) if dist.is_initialized() else int(mode)

"""Which workers are alive, from their heartbeats."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from swarm_common.workers import Heartbeat, WorkerInfo
from swarm_scheduler.placement import Pool


@dataclass
class _Entry:
    info: WorkerInfo
    seen: float


class WorkerTable:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._workers: dict[str, _Entry] = {}
        self._pool: Pool | None = None

    def heartbeat(self, hb: Heartbeat) -> tuple[WorkerInfo, bool]:
        """Record a heartbeat; return the worker's info and whether it is new or came back."""
        previous = self._workers.get(hb.worker_id)
        # Built without validation: every field comes from the heartbeat, validated on arrival
        # (hundreds a second with a thousand workers).
        info = WorkerInfo.model_construct(
            worker_id=hb.worker_id,
            state="alive",
            resources=hb.resources,
            free=hb.free,
            running=hb.running,
            labels=hb.labels,
            last_heartbeat=hb.time,
        )
        self._workers[hb.worker_id] = _Entry(info, self.clock())
        if (
            previous is None
            or previous.info.state != "alive"
            or previous.info.resources != hb.resources
            or previous.info.labels != hb.labels
        ):
            self._pool = None
        return info, previous is None or previous.info.state != "alive"

    def alive(self) -> list[WorkerInfo]:
        return [e.info for e in self._workers.values() if e.info.state == "alive"]

    def pool(self) -> Pool:
        """The alive workers for placement, rebuilt only when one comes, goes or changes its
        resources or labels. Their other fields (free, running, last heartbeat) may be a
        heartbeat old: placement reads only resources and labels."""
        if self._pool is None:
            self._pool = Pool(self.alive())
        return self._pool

    def is_alive(self, worker_id: str) -> bool:
        entry = self._workers.get(worker_id)
        return entry is not None and entry.info.state == "alive"

    def known(self, worker_id: str) -> bool:
        return worker_id in self._workers

    def expire(self) -> list[WorkerInfo]:
        """Mark workers silent past the timeout as lost; return the newly lost ones."""
        now = self.clock()
        lost = []
        for entry in self._workers.values():
            if entry.info.state == "alive" and now - entry.seen > self.timeout_s:
                entry.info = entry.info.model_copy(update={"state": "lost"})
                lost.append(entry.info)
                self._pool = None
        return lost

    def count_by_state(self) -> dict[str, int]:
        counts = {"alive": 0, "lost": 0}
        for entry in list(self._workers.values()):
            counts[entry.info.state] = counts.get(entry.info.state, 0) + 1
        return counts

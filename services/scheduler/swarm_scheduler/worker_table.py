"""Which workers are alive, from their heartbeats."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from swarm_contracts.workers import Heartbeat, WorkerInfo, WorkerOps
from swarm_scheduler.placement import Pool
from swarm_scheduler.speed import flags

# States in which a worker is there: its jobs are not lost to silence (a leaving one is
# checkpointing them; a starting one runs none, and the scheduler takes them back at once).
PRESENT = ("starting", "alive", "leaving")


@dataclass
class _Entry:
    info: WorkerInfo
    seen: float


class WorkerTable:
    def __init__(
        self,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        slow_fraction: float = 0.3,
    ) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.slow_fraction = slow_fraction  # see swarm_scheduler.speed.flags
        self._workers: dict[str, _Entry] = {}
        self._pool: Pool | None = None
        self._ops: dict[str, WorkerOps] = {}

    def set_ops(self, ops: dict[str, WorkerOps]) -> None:
        """The operators' cordons and drains (``worker_ops``): such workers get no new jobs."""
        self._ops = dict(ops)
        self._pool = None
        for entry in self._workers.values():
            entry.info = self._with_ops(entry.info)

    def ops(self, worker_id: str) -> WorkerOps | None:
        return self._ops.get(worker_id)

    def _with_ops(self, info: WorkerInfo) -> WorkerInfo:
        ops = self._ops.get(info.worker_id)
        cordoned = ops is not None and not ops.schedulable
        draining = ops is not None and ops.drain
        suspect = ops is not None and ops.suspect
        if (info.cordoned, info.draining, info.suspect) == (cordoned, draining, suspect):
            return info
        update = {"cordoned": cordoned, "draining": draining, "suspect": suspect}
        return info.model_copy(update=update)

    def info(self, worker_id: str) -> WorkerInfo | None:
        entry = self._workers.get(worker_id)
        return entry.info if entry is not None else None

    def heartbeat(self, hb: Heartbeat) -> tuple[WorkerInfo, bool]:
        """Record a heartbeat; return the worker's info and whether it is new or came back."""
        previous = self._workers.get(hb.worker_id)
        # Built without validation: every field comes from the heartbeat, validated on arrival
        # (hundreds a second with a thousand workers).
        ops = self._ops.get(hb.worker_id)
        same_speed = (
            previous is not None
            and previous.info.benchmark == hb.benchmark
            and previous.info.advertised_tflops == hb.advertised_tflops
            and previous.info.resources == hb.resources
        )
        info = WorkerInfo.model_construct(
            worker_id=hb.worker_id,
            state=hb.state,
            resources=hb.resources,
            free=hb.free,
            running=hb.running,
            labels=hb.labels,
            last_heartbeat=hb.time,
            cached_models=hb.cached_models,
            cordoned=ops is not None and not ops.schedulable,
            draining=ops is not None and ops.drain,
            suspect=ops is not None and ops.suspect,
            benchmark=hb.benchmark,
            advertised_tflops=hb.advertised_tflops,
            # Worked out again only when what they depend on changed.
            flags=previous.info.flags
            if same_speed and previous is not None
            else flags(hb, self.slow_fraction),
            provider=hb.provider,
        )
        self._workers[hb.worker_id] = _Entry(info, self.clock())
        if (
            previous is None
            or not same_speed
            or previous.info.state != hb.state
            or previous.info.labels != hb.labels
            or previous.info.cached_models != hb.cached_models
        ):
            self._pool = None
        came = hb.state == "alive" and (previous is None or previous.info.state != "alive")
        return info, came

    def alive(self) -> list[WorkerInfo]:
        return [e.info for e in self._workers.values() if e.info.state == "alive"]

    def schedulable(self) -> list[WorkerInfo]:
        """Alive, neither leaving nor cordoned or drained by an operator."""
        return [
            e.info
            for e in self._workers.values()
            if e.info.state == "alive" and not e.info.cordoned
        ]

    def held_back(self) -> list[WorkerInfo]:
        """Present workers that take no new jobs: leaving, or cordoned, drained or suspect."""
        return [
            e.info
            for e in self._workers.values()
            if e.info.state in PRESENT and (e.info.state != "alive" or e.info.cordoned)
        ]

    def pool(self) -> Pool:
        """The schedulable workers for placement, rebuilt only when one comes, goes, changes
        its resources, labels, benchmark or cached models, or is cordoned or uncordoned. Their
        other fields (free, running, last heartbeat) may be a heartbeat old: placement reads
        only resources, labels, benchmarks and cached models."""
        if self._pool is None:
            self._pool = Pool(self.schedulable())
        return self._pool

    def is_alive(self, worker_id: str) -> bool:
        """Whether the worker is there: alive, leaving (checkpointing its jobs) or starting."""
        entry = self._workers.get(worker_id)
        return entry is not None and entry.info.state in PRESENT

    def known(self, worker_id: str) -> bool:
        return worker_id in self._workers

    def expire(self) -> list[WorkerInfo]:
        """Mark workers silent past the timeout as lost; return the newly lost ones."""
        now = self.clock()
        lost = []
        for entry in self._workers.values():
            if entry.info.state in PRESENT and now - entry.seen > self.timeout_s:
                entry.info = entry.info.model_copy(update={"state": "lost"})
                lost.append(entry.info)
                self._pool = None
        return lost

    def count_by_state(self) -> dict[str, int]:
        counts = {"starting": 0, "alive": 0, "leaving": 0, "lost": 0, "gone": 0}
        for entry in list(self._workers.values()):
            counts[entry.info.state] = counts.get(entry.info.state, 0) + 1
        return counts

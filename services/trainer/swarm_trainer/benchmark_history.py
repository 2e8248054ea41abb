"""A worker's recent self-benchmarks and the one its heartbeats carry: kept apart from the
measurement itself (``swarm_trainer.benchmark``, which imports torch) so that the agent can
hold them before its heavy imports (its first heartbeats go out before those)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from swarm_contracts.workers import WorkerBenchmark

# Runs kept for choosing what heartbeats carry: a slower machine (a throttled GPU) shows once
# its older, faster runs are out of these.
KEPT = 3


class Benchmarks:
    """The worker's recent self-benchmarks, and the one its heartbeats carry (``reported``):
    the fastest of the recent idle runs (placement ranks workers by TFLOP/s), or of all recent
    runs while none was idle."""

    def __init__(self, kept: int = KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self.recent: deque[WorkerBenchmark] = deque(maxlen=kept)
        self.clock = clock
        self.last_at = clock()  # of the last measurement, or of the start

    def add(self, result: WorkerBenchmark, *, afresh: bool = False) -> None:
        """A new measurement; ``afresh``: forget the earlier ones (an operator asked for a new
        measurement, and sees it carried from now on)."""
        if afresh:
            self.recent.clear()
        self.recent.append(result)
        self.last_at = self.clock()

    def tried(self) -> None:
        """A measurement failed: the next is due a full interval later."""
        self.last_at = self.clock()

    @property
    def reported(self) -> WorkerBenchmark | None:
        idle = [r for r in self.recent if not r.busy]
        candidates = idle or list(self.recent)
        return max(candidates, key=lambda r: r.matmul_tflops) if candidates else None

    def due(self, every_s: float) -> bool:
        """Whether an idle worker should measure again now: every ``every_s`` (0: never), and
        at once while what it reports was measured beside jobs."""
        if every_s <= 0:
            return False
        reported = self.reported
        return (reported is not None and reported.busy) or self.clock() - self.last_at >= every_s

"""The channels between a running job's rank 0 and the agent: progress out, cancel in."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.queue import Queue

# Progress is advisory; checkpoints and results go to the store, so a full queue only ever
# costs progress events, never correctness.
QUEUE_SIZE = 10_000


@ray.remote(num_cpus=0)
class JobControl:
    """A cancel flag the training loop polls every step (a few ms of Ray round trip)."""

    def __init__(self) -> None:
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


def make_channels() -> tuple[Queue, Any]:
    """(progress queue, control actor) for one run; both live in the local Ray cluster."""
    queue = Queue(maxsize=QUEUE_SIZE, actor_options={"num_cpus": 0})
    return queue, JobControl.remote()  # type: ignore[attr-defined]

"""The channels between a running job's rank 0 and the agent: reports out, cancel in.

A stop comes in two kinds: ``CANCEL`` (stop now, save nothing) and ``RELEASE`` (commit a
checkpoint of the current step, then stop: the job is handed back and resumes elsewhere).

Ray imports this module in the ``JobControl`` actor's process, so it imports Ray only (torch
and peft would cost that process seconds of start-up); rank 0's end is ``reporter.Reporter``.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.queue import Queue

# Reports are advisory; checkpoints and results go to the store, so a full queue only ever
# costs progress events, never correctness.
QUEUE_SIZE = 10_000
CANCEL = 1
RELEASE = 2


@ray.remote(num_cpus=0)
class JobControl:
    """A stop flag the training loop polls every step (a few ms of Ray round trip)."""

    def __init__(self) -> None:
        self._mode = 0

    def cancel(self) -> None:
        self._mode = CANCEL

    def release(self) -> None:
        # A cancel already asked for wins: nothing is to be saved then.
        self._mode = self._mode or RELEASE

    def cancelled(self) -> bool:
        return self._mode != 0

    def stop_mode(self) -> int:
        """0 (go on), ``CANCEL`` or ``RELEASE``."""
        return self._mode


def make_channels() -> tuple[Queue, Any]:
    """(report queue, control actor) for one run; both live in the local Ray cluster."""
    queue = Queue(maxsize=QUEUE_SIZE, actor_options={"num_cpus": 0})
    return queue, JobControl.remote()  # type: ignore[attr-defined]

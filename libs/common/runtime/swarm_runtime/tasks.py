"""Stopping a service's background tasks so that a stop always ends."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("swarm.tasks")

STOP_S = 10.0
RECANCEL_S = 0.5


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any] | None], timeout: float = STOP_S
) -> None:
    """Cancel ``tasks`` and wait, at most ``timeout`` seconds, until each has ended.

    A task still running is cancelled again every half second: Python 3.11's
    ``asyncio.wait_for``, which nats-py uses for every request, can turn a cancellation that
    meets a timeout into a ``TimeoutError``, and a loop that logs errors and carries on would
    then never end (a test teardown once waited ten minutes on a leadership loop so)."""
    every = [t for t in tasks if t is not None]
    pending = {t for t in every if not t.done()}
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("%d task(s) did not stop in %.0f s: %s", len(pending), timeout, pending)
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for task in every:
        # Read every outcome, so asyncio never warns of an exception nobody retrieved.
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("%s ended with %r while stopping", task.get_name(), exc)

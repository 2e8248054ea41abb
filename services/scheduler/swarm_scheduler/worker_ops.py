"""The operators' standing instructions for workers (cordon, drain), followed from their bucket.

The ``worker_ops`` bucket is the record (the gateway writes it); this is the scheduler's copy,
read whole at start and kept up to date by a watch, so that a restarted or newly leading
scheduler honours every cordon and drain without anyone repeating them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import ValidationError

from swarm_contracts.workers import WorkerOps
from swarm_runtime.kv_watch import watch_bucket

log = logging.getLogger("swarm.scheduler")


class WorkerOpsView:
    def __init__(self, on_change: Callable[[dict[str, WorkerOps]], None]) -> None:
        """``on_change(ops)``: called with every worker's instructions after each change."""
        self.ops: dict[str, WorkerOps] = {}
        self._on_change = on_change
        self._watcher: KeyValue.KeyWatcher | None = None

    async def load(self, kv: KeyValue) -> None:
        """Read the whole bucket, then keep watching it (``follow``)."""
        first = await watch_bucket(kv)
        self._watcher = first.watcher
        for entry in first.entries:
            self._apply(entry.key, entry.value, entry.operation)
        self._on_change(self.ops)

    async def follow(self) -> None:
        assert self._watcher is not None, "load() first"
        async for entry in self._watcher:
            if entry is not None:
                self._apply(entry.key, entry.value, entry.operation)
                self._on_change(self.ops)

    async def close(self) -> None:
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    def _apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        if operation in (KV_DEL, KV_PURGE) or not value:
            self.ops.pop(key, None)
            return
        try:
            self.ops[key] = WorkerOps.model_validate_json(value)
        except ValidationError:
            # Only the gateway writes here; a bad entry must not stop the scheduler.
            log.exception("ignored an unreadable worker_ops entry for %s", key)

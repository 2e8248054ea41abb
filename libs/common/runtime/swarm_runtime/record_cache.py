"""A KV bucket's live records in memory, kept current by a watch: listings read from here.

``RecordTable.all`` reads the bucket key by key: fine for a sweep's dozen trials, not for a
jobs listing served hundreds of times a second over thousands of jobs. A listing from the
cache is as fresh as a read of the bucket: before answering, ``all`` asks the bucket's stream
for its last sequence and waits (briefly) until the watch has applied it, so a write that was
acknowledged before the listing began is in it (read-your-writes, one small request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Generic

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from swarm_runtime.kv_watch import STOP_S, watch_bucket
from swarm_runtime.nats_private import bucket_stream
from swarm_runtime.records import M, RecordTable

log = logging.getLogger(__name__)

# How long a listing waits for the watch to catch up before it reads the bucket itself.
CATCH_UP_S = 2.0


class RecordCache(Generic[M]):
    def __init__(self, table: RecordTable[M]) -> None:
        self.table = table
        self._records: dict[str, M] = {}
        self._seen = 0  # the highest stream sequence (entry revision) applied
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # Bounded: a watch whose unsubscribe never completes (NATS going away under it)
            # must not hold up the service's shutdown.
            await asyncio.wait({self._task}, timeout=STOP_S)

    async def all(self) -> list[M]:
        """Every live record, as of a moment after the call began."""
        bucket = bucket_stream(self.table.kv)
        try:
            last = (await bucket.js.stream_info(bucket.stream)).state.last_seq
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._seen >= last), CATCH_UP_S
                )
        except TimeoutError:
            log.warning("record cache of %s is behind; reading the bucket", bucket.stream)
            return await self.table.all()
        return list(self._records.values())

    def peek(self, key: str) -> M | None:
        """The record as the watch last saw it: milliseconds behind the bucket, at no cost
        (for checks repeated every second, like an SSE stream's "is the job over yet")."""
        return self._records.get(key)

    async def _follow(self) -> None:
        """Apply the bucket's changes; a broken watch (NATS away) is started again."""
        bucket = bucket_stream(self.table.kv)
        while True:
            try:
                # Every message up to here is either in the watch's first pass (the last of
                # its key) or replaced by one that is. The pass fills a new dict, which
                # replaces the old one only when complete: a listing meanwhile answers from
                # the old (or waits).
                first = await watch_bucket(self.table.kv)
                fresh: dict[str, M] = {}
                for entry in first.entries:
                    self._apply(fresh, entry)
                self._records = fresh
                await self._advance(first.revision)
                try:
                    async for entry in first.watcher:
                        if entry is not None:  # nats.py's marker, when it comes after the pass
                            self._apply(self._records, entry)
                            await self._advance(entry.revision or 0)
                finally:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(first.watcher.stop(), STOP_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("watch of %s broke; starting it again", bucket.stream, exc_info=True)
                await asyncio.sleep(1.0)

    def _apply(self, records: dict[str, M], entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
            records.pop(entry.key, None)
        else:
            records[entry.key] = self.table.model.model_validate_json(entry.value)

    async def _advance(self, revision: int) -> None:
        async with self._changed:
            self._seen = max(self._seen, revision)
            self._changed.notify_all()

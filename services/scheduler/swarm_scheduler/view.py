"""The scheduler's live view of the jobs bucket, and its writes to it.

The records live in the ``jobs`` KV bucket; this process follows the bucket with a watch and
changes records only by compare-and-set, so a stale view can at worst make a write fail, never
make it wrong. The view keeps the KV revision of every record, and the records themselves only
while not yet terminal, so that neither a placement pass nor the garbage collector's full
passes grow with the history of finished jobs (of those the revision is enough to tell a stale
watch entry from a newer one).

Its own writes go into the view at once (capacity must never be computed from a view that
misses an assignment just made); a watch entry of a record that comes while a write to that
record is in flight is held back, and applied only if it is newer than what the write left:
most are the echo of the write itself, which is then never parsed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from swarm_contracts.jobs import JobRecord, utcnow
from swarm_runtime.kv_watch import watch_bucket
from swarm_runtime.records import Conflict, RecordTable
from swarm_scheduler.placement import HOLDING, Capacity, demand
from swarm_scheduler.transitions import copy_record

_NONE = Capacity(0, 0)


class WatchEntry(Protocol):
    """What a KV watch hands over (nats-py's ``KeyValue.Entry``)."""

    @property
    def key(self) -> str: ...
    @property
    def revision(self) -> int | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def operation(self) -> str | None: ...


Change = Callable[[JobRecord], JobRecord | None]


class JobView:
    def __init__(self, on_closed: Callable[[str], None] | None = None) -> None:
        """``on_closed(job_id)``: called when a record leaves the open set (finished or
        deleted), for state the scheduler keeps per open job."""
        self.revisions: dict[str, int] = {}
        self.open: dict[str, JobRecord] = {}
        # worker id -> capacity its assigned and running records hold, kept up to date on
        # every change of the view, so that a placement pass need not add up every open job.
        self.held: dict[str, Capacity] = {}
        self._on_closed = on_closed
        # job id -> this process's writes to its record in flight, and the latest watch entry
        # of the record that came meanwhile.
        self._writing: dict[str, int] = {}
        self._parked: dict[str, WatchEntry] = {}
        self._table: RecordTable[JobRecord] | None = None
        self._watcher: KeyValue.KeyWatcher | None = None

    # --- following the bucket ------------------------------------------------------------

    async def load(self, kv: KeyValue) -> None:
        """Read the whole bucket into the view and keep watching it (``follow``)."""
        self._table = RecordTable(kv, JobRecord)
        first = await watch_bucket(kv)
        self._watcher = first.watcher
        for entry in first.entries:
            self.apply(entry)

    async def follow(self) -> None:
        """Apply the bucket's changes as they come (runs until cancelled)."""
        assert self._watcher is not None, "load() first"
        async for entry in self._watcher:
            if entry is not None:
                self.apply(entry)

    async def close(self) -> None:
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    @property
    def table(self) -> RecordTable[JobRecord]:
        assert self._table is not None, "load() first"
        return self._table

    def apply(self, entry: WatchEntry) -> None:
        key, revision = entry.key, entry.revision or 0
        if key in self._writing:
            parked = self._parked.get(key)
            if parked is None or (parked.revision or 0) < revision:
                self._parked[key] = entry
            return
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
            gone = self.open.pop(key, None)
            self.revisions.pop(key, None)
            if gone is not None:
                self._hold(gone, -1)
            self._closed(key)
            return
        if self.revisions.get(key, 0) < revision:
            self._store(JobRecord.model_validate_json(entry.value), revision)

    # --- reading -------------------------------------------------------------------------

    def finished(self, job_id: str) -> bool:
        """Whether the view has the job's record, terminal (and therefore not kept whole)."""
        return job_id in self.revisions and job_id not in self.open

    async def read(self, job_id: str) -> JobRecord | None:
        """The record from the bucket (for a finished job, whose record the view drops)."""
        found = await self.table.get(job_id)
        return found[0] if found is not None else None

    # --- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, job_id: str) -> Iterator[None]:
        """Around a write to the job's record and its ``remember``: the record's watch entries
        that come meanwhile are held back, then applied only if newer than what was written."""
        self._writing[job_id] = self._writing.get(job_id, 0) + 1
        try:
            yield
        finally:
            if (left := self._writing.pop(job_id) - 1) > 0:
                self._writing[job_id] = left
            elif (parked := self._parked.pop(job_id, None)) is not None:
                self.apply(parked)

    def remember(self, record: JobRecord, revision: int) -> None:
        """Put a record this process wrote into the view (unless the view is already newer)."""
        if self.revisions.get(record.job_id, 0) < revision:
            self._store(record, revision)

    async def create(self, record: JobRecord) -> None:
        """Create the record; ``Conflict`` if it exists already."""
        with self.writing(record.job_id):
            self.remember(record, await self.table.create(record.job_id, record))

    async def update(self, new: JobRecord, revision: int) -> None:
        """Compare-and-set against ``revision``; ``Conflict`` if the record changed since."""
        with self.writing(new.job_id):
            self.remember(new, await self.table.update(new.job_id, new, revision))

    async def modify(self, job_id: str, change: Change) -> JobRecord | None:
        """Apply ``change`` (given a copy; None leaves the record as it is) by compare-and-set.

        The record written, or None when nothing was written."""

        def stamped(r: JobRecord) -> JobRecord | None:
            new = change(r)
            if new is not None:
                new.updated_at = utcnow()
            return new

        # Fast path: compare-and-set against the view's revision, saving a read; a conflict
        # (the view was behind) falls back to read-modify-write. A no-op on the view is
        # re-checked on the bucket, in case the view was behind.
        cached = self.open.get(job_id)
        if cached is not None:
            new = stamped(copy_record(cached))
            if new is not None:
                with contextlib.suppress(Conflict):
                    await self.update(new, self.revisions[job_id])
                    return new
        with self.writing(job_id):
            written = await self.table.modify(job_id, stamped)
            if written is None:
                return None
            self.remember(*written)
            return written[0]

    # --- bookkeeping ---------------------------------------------------------------------

    def _store(self, record: JobRecord, revision: int) -> None:
        job_id = record.job_id
        previous = self.open.get(job_id)
        if previous is not None:
            self._hold(previous, -1)
        self.revisions[job_id] = revision
        if record.state.terminal:
            self.open.pop(job_id, None)
            self._closed(job_id)
        else:
            self._hold(record, +1)
            self.open[job_id] = record

    def _closed(self, job_id: str) -> None:
        if self._on_closed is not None:
            self._on_closed(job_id)

    def _hold(self, record: JobRecord, sign: int) -> None:
        """Add (+1) or take back (-1) what ``record`` holds on its worker."""
        if not record.worker_id or record.state not in HOLDING:
            return
        need = demand(record.spec)
        prev = self.held.get(record.worker_id, _NONE)
        now = Capacity(prev.cpus + sign * need.cpus, prev.gpus + sign * need.gpus)
        if now == _NONE:
            del self.held[record.worker_id]
        else:
            self.held[record.worker_id] = now

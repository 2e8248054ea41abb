"""Pydantic records in a JetStream KV bucket, changed only by compare-and-set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class Conflict(Exception):
    """The record changed since it was read (or exists already, for ``create``)."""


class RecordTable(Generic[M]):
    def __init__(self, kv: KeyValue, model: type[M]) -> None:
        self.kv = kv
        self.model = model

    async def get(self, key: str) -> tuple[M, int] | None:
        """The record and its revision, or None."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None
        return self.model.model_validate_json(entry.value), entry.revision

    async def create(self, key: str, record: M) -> int:
        try:
            return await self.kv.create(key, record.model_dump_json().encode())
        except KeyWrongLastSequenceError as exc:
            raise Conflict(key) from exc

    async def put(self, key: str, record: M) -> int:
        """Unconditional write, for records with a single writer (e.g. worker liveness)."""
        return await self.kv.put(key, record.model_dump_json().encode())

    async def update(self, key: str, record: M, revision: int) -> int:
        try:
            return await self.kv.update(key, record.model_dump_json().encode(), last=revision)
        except KeyWrongLastSequenceError as exc:
            raise Conflict(key) from exc

    async def modify(
        self, key: str, change: Callable[[M], M | None], retries: int = 20
    ) -> tuple[M, int] | None:
        """Read, apply ``change``, write by compare-and-set; re-read and retry on conflict.

        ``change`` gets a copy and returns the new record, or None to leave it as it is.
        Returns the record written and its revision, or None when nothing was written.
        """
        for _ in range(retries):
            found = await self.get(key)
            if found is None:
                return None
            record, revision = found
            new = change(record.model_copy(deep=True))
            if new is None:
                return None
            try:
                return new, await self.update(key, new, revision)
            except Conflict:
                continue
        raise Conflict(f"{key}: too many concurrent changes")

    async def delete(self, key: str) -> None:
        await self.kv.delete(key)

    async def keys(self) -> list[str]:
        """The live keys (deleted and purged ones left out).

        Not nats-py's ``kv.keys()``: its push watcher can signal "no more keys" before the
        messages already on the wire are handled, and so answer ``[]`` for a full bucket. A
        pull consumer delivers nothing until asked, so its pending count is exact.
        """
        # KeyValue keeps its JetStream context, stream and subject prefix private.
        js, stream, prefix = self.kv._js, self.kv._stream, self.kv._pre
        # The create reply already holds the pending count; the server drops the consumer
        # once idle, so listing keys costs two JetStream API calls and the fetches.
        info = await js.add_consumer(
            stream,
            ConsumerConfig(
                name=js._nc._nuid.next().decode(),
                filter_subject=f"{prefix}>",
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=AckPolicy.NONE,
                headers_only=True,
                mem_storage=True,
                inactive_threshold=5.0,
            ),
        )
        pending, keys = info.num_pending, []
        if not pending:
            return keys
        sub = await js.pull_subscribe_bind(consumer=info.name, stream=stream)
        try:
            while pending:
                for msg in await sub.fetch(batch=min(pending, 1024), timeout=10):
                    if (msg.headers or {}).get(KV_OP) not in (KV_DEL, KV_PURGE):
                        keys.append(msg.subject[len(prefix) :])
                    pending = msg.metadata.num_pending
            return keys
        finally:
            await sub.unsubscribe()

    async def all(self) -> list[M]:
        records = []
        for key in await self.keys():
            found = await self.get(key)
            if found is not None:
                records.append(found[0])
        return records

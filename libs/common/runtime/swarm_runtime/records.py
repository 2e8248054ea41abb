"""Pydantic records in a JetStream KV bucket, changed only by compare-and-set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue
from pydantic import BaseModel

from swarm_runtime.nats_private import bucket_stream

M = TypeVar("M", bound=BaseModel)
KEYS_BATCH = 1024


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
        if entry.value is None or entry.revision is None or entry.operation in ("DEL", "PURGE"):
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

    async def delete(self, key: str, revision: int | None = None) -> None:
        """Delete the record; with ``revision``, only if it is still that one (``Conflict``
        otherwise)."""
        try:
            await self.kv.delete(key, last=revision)
        except KeyWrongLastSequenceError as exc:
            raise Conflict(key) from exc

    async def keys(self, match: str = ">") -> list[str]:
        """The live keys (deleted and purged ones left out), as the bucket is now; ``match``
        is a subject-style filter on the keys (``sweep-1.*``: the keys under ``sweep-1.``).

        Not nats-py's ``kv.keys()``: its push watcher can signal "no more keys" before the
        messages already on the wire are handled, and so answer ``[]`` for a full bucket.
        Here an ephemeral pull consumer (last message per key, headers only) is fetched from:
        each fetch starts with a ``no_wait`` pull request, which the server ends with a
        404/408 status once it has sent what it has, so a short batch ends the listing
        exactly, whatever was written meanwhile; after a full batch the consumer's count of
        messages still pending says whether there are more.
        """
        bucket = bucket_stream(self.kv)
        info = await bucket.js.add_consumer(
            bucket.stream,
            ConsumerConfig(
                filter_subject=f"{bucket.prefix}{match}",
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=AckPolicy.NONE,
                headers_only=True,
                mem_storage=True,
                # The server drops it once idle: no delete call per listing.
                inactive_threshold=5.0,
            ),
        )
        if not info.num_pending:
            return []
        sub = await bucket.js.pull_subscribe_bind(consumer=info.name, stream=bucket.stream)
        # key -> live; a key written again during the listing comes twice, the last one wins.
        live: dict[str, bool] = {}
        try:
            while True:
                try:
                    msgs = await sub.fetch(KEYS_BATCH, timeout=10)
                except TimeoutError:  # nothing left after all (the stream was purged)
                    msgs = []
                for msg in msgs:
                    key = msg.subject[len(bucket.prefix) :]
                    live[key] = (msg.headers or {}).get(KV_OP) not in (KV_DEL, KV_PURGE)
                if len(msgs) < KEYS_BATCH or not (await sub.consumer_info()).num_pending:
                    return [key for key, alive in live.items() if alive]
        finally:
            await sub.unsubscribe()

    async def all(self, match: str = ">") -> list[M]:
        records = []
        for key in await self.keys(match):
            found = await self.get(key)
            if found is not None:
                records.append(found[0])
        return records

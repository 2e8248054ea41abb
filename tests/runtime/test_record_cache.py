"""The jobs listing's in-memory copy of a KV bucket, against a real nats-server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from nats.js.kv import KeyValue

from swarm_runtime.record_cache import RecordCache
from swarm_runtime.records import RecordTable

from .test_records import Counter, nc, table

# The table and its connection as the records tests make them.
__all__ = ["nc", "table"]


@pytest.fixture
async def cache(table: RecordTable[Counter]) -> AsyncIterator[RecordCache[Counter]]:
    cache = RecordCache(table)
    await cache.start()
    yield cache
    await cache.stop()


def values(records: list[Counter]) -> dict[str, int]:
    return {r.name: r.value for r in records}


async def test_an_empty_bucket_lists_nothing_without_reading_the_bucket(
    cache: RecordCache[Counter], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert await cache.all() == []
    assert "behind" not in caplog.text


async def test_records_written_before_the_watch_began_are_listed(
    table: RecordTable[Counter],
) -> None:
    for i in range(5):
        await table.create(f"c{i}", Counter(name=f"c{i}", value=i))
    await table.delete("c3")
    cache = RecordCache(table)
    await cache.start()
    try:
        assert values(await cache.all()) == {"c0": 0, "c1": 1, "c2": 2, "c4": 4}
    finally:
        await cache.stop()


def marker_first(kv: KeyValue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``kv``'s watches deliver nats.py's "first pass over" marker ahead of the pass, as
    nats.py does on a loaded machine (the server has sent the pass, the client not read it)."""
    watchall = kv.watchall

    async def watch(**kwargs: object) -> KeyValue.KeyWatcher:
        watcher = await watchall(**kwargs)
        early = asyncio.Queue[object](maxsize=256)
        early.put_nowait(None)
        while not watcher._updates.empty():
            early.put_nowait(watcher._updates.get_nowait())
        watcher._updates = early  # type: ignore[assignment]
        watcher._init_done = True
        return watcher

    monkeypatch.setattr(kv, "watchall", watch)


async def test_a_first_pass_marker_ahead_of_the_pass_does_not_end_it(
    table: RecordTable[Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats.py puts its "first pass over" marker in the queue when the server reports nothing
    pending and the client has counted nothing delivered; on a loaded machine the pass is then
    still unread, and the marker comes first (CI saw an empty listing of a full bucket)."""
    for i in range(5):
        await table.create(f"c{i}", Counter(name=f"c{i}", value=i))
    marker_first(table.kv, monkeypatch)
    cache = RecordCache(table)
    await cache.start()
    try:
        assert values(await cache.all()) == {f"c{i}": i for i in range(5)}
    finally:
        await cache.stop()


async def test_every_acknowledged_write_is_in_the_next_listing(
    table: RecordTable[Counter], cache: RecordCache[Counter], caplog: pytest.LogCaptureFixture
) -> None:
    expected: dict[str, int] = {}
    with caplog.at_level(logging.WARNING):
        for i in range(40):
            key = f"c{i % 7}"
            if i % 5 == 4 and key in expected:
                await table.delete(key)
                expected.pop(key)
            else:
                await table.put(key, Counter(name=key, value=i))
                expected[key] = i
            # No sleep: the listing itself waits for the watch to reach the write.
            assert values(await cache.all()) == expected
    assert "behind" not in caplog.text  # answered from memory, not by reading the bucket

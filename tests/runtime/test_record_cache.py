"""The jobs listing's in-memory copy of a KV bucket, against a real nats-server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

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

"""A whole bucket's watch whose first pass is read complete, against a real nats-server."""

from __future__ import annotations

import pytest
from nats.js.kv import KV_DEL

from swarm_runtime.kv_watch import watch_bucket
from swarm_runtime.records import RecordTable

from .test_record_cache import marker_first
from .test_records import Counter, nc, table

# The table and its connection as the records tests make them.
__all__ = ["nc", "table"]


async def test_an_empty_bucket_s_first_pass_is_empty_and_later_writes_follow(
    table: RecordTable[Counter],
) -> None:
    first = await watch_bucket(table.kv)
    try:
        assert first.entries == []
        await table.create("c0", Counter(name="c0", value=0))
        entry = await first.watcher.updates(timeout=5)
        while entry is None:  # nats.py's own marker, after the (empty) pass
            entry = await first.watcher.updates(timeout=5)
        assert (entry.key, entry.revision) == ("c0", 1)
    finally:
        await first.watcher.stop()


@pytest.mark.parametrize("early_marker", [False, True])
async def test_the_first_pass_holds_every_key_s_latest_entry(
    table: RecordTable[Counter], monkeypatch: pytest.MonkeyPatch, early_marker: bool
) -> None:
    for i in range(5):
        await table.create(f"c{i}", Counter(name=f"c{i}", value=i))
    await table.put("c1", Counter(name="c1", value=10))
    await table.delete("c3")
    if early_marker:
        marker_first(table.kv, monkeypatch)
    first = await watch_bucket(table.kv)
    try:
        latest = {e.key: (e.revision, e.operation) for e in first.entries}
        assert latest == {
            "c0": (1, None),
            "c1": (6, None),
            "c2": (3, None),
            "c3": (7, KV_DEL),
            "c4": (5, None),
        }
        assert first.revision == 7
    finally:
        await first.watcher.stop()

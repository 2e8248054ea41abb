"""Pydantic records in JetStream KV, changed only by compare-and-set (real nats-server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from pydantic import BaseModel

from swarm_contracts.subjects import Subjects
from swarm_runtime.records import Conflict, RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket


class Counter(BaseModel):
    name: str
    value: int = 0


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    yield client
    await client.drain()


@pytest.fixture
async def table(nc: Client, namespace: str) -> RecordTable[Counter]:
    kv = await kv_bucket(nc.jetstream(), Subjects(namespace), "jobs")
    return RecordTable(kv, Counter)


async def test_create_get(table: RecordTable[Counter]) -> None:
    assert await table.get("c1") is None
    rev = await table.create("c1", Counter(name="c1", value=1))
    found = await table.get("c1")
    assert found == (Counter(name="c1", value=1), rev)


async def test_create_conflict(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=1))
    with pytest.raises(Conflict):
        await table.create("c1", Counter(name="c1", value=2))
    record, _ = await table.get("c1")  # type: ignore[misc]
    assert record.value == 1  # the first one stays


async def test_create_after_delete(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1"))
    await table.delete("c1")
    assert await table.get("c1") is None
    await table.create("c1", Counter(name="c1", value=5))
    assert (await table.get("c1"))[0].value == 5  # type: ignore[index]


async def test_update_conflicts_on_stale_revision(table: RecordTable[Counter]) -> None:
    rev1 = await table.create("c1", Counter(name="c1", value=1))
    rev2 = await table.update("c1", Counter(name="c1", value=2), rev1)
    assert rev2 > rev1
    with pytest.raises(Conflict):
        await table.update("c1", Counter(name="c1", value=99), rev1)  # stale
    assert await table.get("c1") == (Counter(name="c1", value=2), rev2)
    rev3 = await table.update("c1", Counter(name="c1", value=3), rev2)
    assert await table.get("c1") == (Counter(name="c1", value=3), rev3)


async def test_put_is_unconditional(table: RecordTable[Counter]) -> None:
    await table.put("c1", Counter(name="c1", value=1))
    rev = await table.put("c1", Counter(name="c1", value=2))
    assert await table.get("c1") == (Counter(name="c1", value=2), rev)


async def test_modify(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=1))

    def bump(c: Counter) -> Counter:
        c.value += 1
        return c

    result = await table.modify("c1", bump)
    assert result is not None
    record, rev = result
    assert record.value == 2
    assert await table.get("c1") == (record, rev)


async def test_modify_missing_or_no_change(table: RecordTable[Counter]) -> None:
    assert await table.modify("nope", lambda c: c) is None
    rev = await table.create("c1", Counter(name="c1", value=1))
    assert await table.modify("c1", lambda c: None) is None
    assert await table.get("c1") == (Counter(name="c1", value=1), rev)  # nothing written


async def test_modify_works_on_a_copy(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=1))
    seen: list[Counter] = []

    def change(c: Counter) -> None:
        c.value = 100  # mutating the argument and returning None writes nothing
        seen.append(c)

    await table.modify("c1", change)
    assert (await table.get("c1"))[0].value == 1  # type: ignore[index]


class RacingTable(RecordTable[Counter]):
    """Another writer sneaks in between each of the first ``races`` reads and the write."""

    def __init__(self, other: RecordTable[Counter], races: int) -> None:
        super().__init__(other.kv, Counter)
        self.other = other
        self.races = races
        self.reads = 0

    async def get(self, key: str) -> tuple[Counter, int] | None:
        found = await super().get(key)
        self.reads += 1
        if found is not None and self.reads <= self.races:
            record, _ = found
            await self.other.put(key, Counter(name=key, value=record.value + 1000))
        return found


async def test_modify_retries_on_conflict(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=1))
    racing = RacingTable(table, races=2)
    calls: list[int] = []

    def bump(c: Counter) -> Counter:
        calls.append(c.value)
        c.value += 1
        return c

    result = await racing.modify("c1", bump)
    # Two conflicts, then success on the third read, applied to the latest value.
    assert calls == [1, 1001, 2001]
    assert result is not None
    assert result[0].value == 2002
    assert (await table.get("c1"))[0].value == 2002  # type: ignore[index]


async def test_modify_gives_up(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=1))
    racing = RacingTable(table, races=10**6)
    with pytest.raises(Conflict):
        await racing.modify("c1", lambda c: c, retries=3)
    assert racing.reads == 3


async def test_concurrent_modifies_lose_no_update(table: RecordTable[Counter]) -> None:
    await table.create("c1", Counter(name="c1", value=0))

    def bump(c: Counter) -> Counter:
        c.value += 1
        return c

    await asyncio.gather(*(table.modify("c1", bump, retries=100) for _ in range(15)))
    assert (await table.get("c1"))[0].value == 15  # type: ignore[index]


async def test_keys_and_all(table: RecordTable[Counter]) -> None:
    assert await table.keys() == []
    assert await table.all() == []
    for name in ("a", "b", "c"):
        await table.create(name, Counter(name=name))
    await table.delete("b")
    assert sorted(await table.keys()) == ["a", "c"]
    assert sorted(c.name for c in await table.all()) == ["a", "c"]


async def test_keys_and_all_under_a_prefix(table: RecordTable[Counter]) -> None:
    for key in ("s1.00000", "s1.00001", "s10.00000", "s2.00000", "s1"):
        await table.create(key, Counter(name=key))
    assert sorted(await table.keys("s1.*")) == ["s1.00000", "s1.00001"]
    assert sorted(c.name for c in await table.all("s2.*")) == ["s2.00000"]
    assert await table.keys("s3.*") == []


async def test_keys_of_a_bucket_larger_than_one_pull_while_it_changes(
    table: RecordTable[Counter],
) -> None:
    from swarm_runtime.records import KEYS_BATCH

    names = [f"k{i:04d}" for i in range(KEYS_BATCH + 50)]
    await asyncio.gather(*(table.put(n, Counter(name=n)) for n in names))

    async def churn() -> None:
        # Rewrites during the listing supersede messages the consumer was going to deliver.
        for n in names[:200]:
            await table.put(n, Counter(name=n, value=1))

    listed, _ = await asyncio.gather(table.keys(), churn())
    assert sorted(listed) == names

"""``Lead``: a service's seat in its election, its leader-only consumers, its handlers' check
(the skeleton the scheduler and the sweeps controller share), against a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from pydantic import BaseModel

from swarm_contracts.envelope import CloudEvent, envelope
from swarm_contracts.subjects import Subjects
from swarm_runtime.intake import Intake, RetryLater
from swarm_runtime.leader import Lead
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology


class Ping(BaseModel):
    n: int


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    await ensure_topology(client.jetstream(), Subjects(settings.namespace))
    yield client
    await client.drain()


async def _until(check: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


class Member:
    """One process of a led service: its lead, and a leader-only intake noting what it got."""

    def __init__(self, name: str, nc: Client, subjects: Subjects, seen: list[str]) -> None:
        self.name, self.seen = name, seen
        self.got: list[int] = []
        self.lead = Lead("svc", self.changed)
        self.intake = Intake("svc", subjects, subjects.heartbeat(), self.on_ping)
        self.lead.leader_only([self.intake], lambda: nc)

    async def changed(self, leading: bool) -> None:
        # The service's own hook runs before its consumers start or stop.
        self.seen.append(f"{self.name} {'leads' if leading else 'follows'}, {self.intake.running}")

    async def on_ping(self, event: CloudEvent[Ping]) -> None:
        self.lead.check()
        self.got.append(event.data.n)


async def test_only_the_leader_consumes_and_a_follower_takes_over_when_it_leaves(
    nc: Client, settings: Settings
) -> None:
    subjects = Subjects(settings.namespace)
    seen: list[str] = []
    a, b = Member("a", nc, subjects, seen), Member("b", nc, subjects, seen)
    await a.lead.prepare(nc.jetstream(), subjects, lease_s=30.0)
    await b.lead.prepare(nc.jetstream(), subjects, lease_s=30.0)
    assert (a.lead.leading, b.lead.leading) == (True, False)
    assert (a.intake.running, b.intake.running) == (True, False)
    assert a.lead.holder.startswith("svc-")
    assert a.lead.holder != b.lead.holder
    with pytest.raises(RetryLater):
        b.lead.check()  # a follower's handler gives a message back for the leader

    body = envelope("test", "swarm.test.ping", Ping(n=1)).model_dump_json().encode()
    await nc.publish(subjects.heartbeat("w1"), body)
    await _until(lambda: a.got)
    assert (a.got, b.got) == ([1], [])

    await a.lead.stop()  # hands the lease back: b need not wait out the 30 s
    assert not a.intake.running
    assert b.lead.leadership is not None
    await b.lead.leadership.tick()
    assert b.lead.leading
    assert b.intake.running
    assert seen == ["a leads, False", "a follows, True", "b leads, False"]
    await b.lead.stop()
    assert not b.intake.running

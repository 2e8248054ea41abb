"""Publishing job events into the real events stream, and starting telemetry instances."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from faststream.nats import NatsBroker

from swarm_contracts.events import JobEvent
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology

Publish = Callable[[JobEvent], Awaitable[None]]


@pytest.fixture
async def events_broker(settings: Settings) -> AsyncIterator[NatsBroker]:
    broker = make_broker(settings, "test")
    await broker.connect()
    await ensure_topology(broker.connection.jetstream(), Subjects(settings.namespace))
    yield broker
    await broker.stop()


@pytest.fixture
def publish(events_broker: NatsBroker, settings: Settings) -> Publish:
    subjects = Subjects(settings.namespace)

    async def publish(event: JobEvent) -> None:
        await publish_job_event(events_broker, subjects, "trainer", event)

    return publish

"""``lineage.worker_ids``: every worker that started an attempt, read from the job's events."""

from __future__ import annotations

import nats
from faststream.nats import NatsBroker

from swarm_contracts.events import Started
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import publish_job_event
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology
from swarm_trainer.job_history import workers_that_ran


async def test_workers_of_earlier_attempts_come_first_and_this_one_last(
    settings: Settings,
) -> None:
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    broker = NatsBroker(settings.nats_url)
    await broker.connect()
    try:
        js = nc.jetstream()
        await ensure_topology(js, subjects)
        # A job with no history yet (or none readable) still names this worker.
        assert await workers_that_ran(js, subjects, "job-none", 1, "w-c") == ["w-c"]

        for attempt, worker in [(1, "w-a"), (2, "w-b"), (3, "w-a"), (4, "w-c"), (5, "w-d")]:
            event = Started(job_id="job-1", attempt=attempt, worker_id=worker)
            await publish_job_event(broker, subjects, "trainer", event)
        # Attempt 4 on w-c: a later attempt (5) is not this run's history.
        assert await workers_that_ran(js, subjects, "job-1", 4, "w-c") == ["w-a", "w-b", "w-c"]
    finally:
        await broker.stop()
        await nc.close()

"""The scheduler's /metrics, scraped over HTTP while it queues and places a real job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from swarm_contracts.jobs import JobState
from swarm_registry.app import build_app as build_registry
from swarm_runtime.settings import Settings
from swarm_scheduler.app import build_app as build_scheduler
from swarm_scheduler.settings import SchedulerSettings

from ..conftest import sample, scrape
from .conftest import Harness


async def test_queue_placement_workers_and_messages_move(
    settings: Settings, tmp_path: Path
) -> None:
    settings = SchedulerSettings.of(settings, metrics_port=0, worker_timeout_s=1.5)
    nc = await nats.connect(settings.nats_url)
    h = Harness(settings, nc)
    await h.setup()
    app = build_scheduler(settings)
    try:
        async with build_registry(settings), app:
            port = app.context.get("metrics_server").port
            assert port, "port 0 must pick a free port"
            await h.register_model("tiny", tmp_path)

            await h.submit(h.spec(priority=7), "m-1", job_id="job-00000000000000a1")
            await h.wait_record("job-00000000000000a1", lambda r: r.state == JobState.queued)
            before = await asyncio.to_thread(scrape, port)
            assert sample(before, "swarm_scheduler_queue_depth", priority="7") == 1
            assert sample(before, "swarm_scheduler_open_jobs", state="queued") == 1
            assert sample(before, "swarm_scheduler_placements_total") == 0
            assert sample(before, "swarm_scheduler_leader") == 1
            submit = f"{settings.namespace}.swarm.jobs.submit"
            assert sample(before, "swarm_scheduler_received_messages_total", handler=submit) == 1
            # Job events are labelled by subject template, never by job id.
            assert (
                sample(
                    before,
                    "swarm_scheduler_published_messages_total",
                    destination=f"{settings.namespace}.swarm.jobs.{{job}}.events.queued",
                )
                >= 1
            )

            async with h.beating("w1"):
                await h.wait_record("job-00000000000000a1", lambda r: r.state == JobState.assigned)
                after = await asyncio.to_thread(scrape, port)
            assert sample(after, "swarm_scheduler_queue_depth", priority="7") == 0
            assert sample(after, "swarm_scheduler_placements_total") == 1
            assert sample(after, "swarm_scheduler_placement_latency_seconds_count") == 1
            assert sample(after, "swarm_scheduler_placement_latency_seconds_sum") > 0
            assert sample(after, "swarm_scheduler_workers", state="alive") == 1
            heartbeat = f"{settings.namespace}.swarm.workers.{{worker}}.heartbeat"
            assert (
                sample(
                    after,
                    "swarm_scheduler_received_processed_messages_duration_seconds_count",
                    handler=heartbeat,
                )
                >= 1
            )

            # A silent worker is counted as lost.
            await asyncio.sleep(2.5)
            lost = await asyncio.to_thread(scrape, port)
            assert sample(lost, "swarm_scheduler_workers", state="lost") == 1
    finally:
        await nc.close()

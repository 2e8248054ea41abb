"""The trainer agent's /metrics, scraped over HTTP after it trained a tiny job for real."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from swarm_contracts.subjects import Subjects
from swarm_registry.app import build_app as build_registry
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_trainer.app import build_app
from swarm_trainer.settings import TrainerSettings

from ..conftest import sample, scrape
from .conftest import make_assignment
from .test_agent import publish_assignment

pytestmark = pytest.mark.slow

MAX_STEPS = 12


async def test_steps_throughput_machine_and_messages(
    settings: Settings, tiny_model_dir: Path, ray_cluster: None
) -> None:
    settings = TrainerSettings.of(
        settings, worker_id="w-metrics", heartbeat_interval_s=0.5, metrics_port=0
    )
    s = Subjects(settings.namespace)
    job = make_assignment(
        open_store(settings),
        tiny_model_dir,
        worker_id="w-metrics",
        training={"max_steps": MAX_STEPS, "eval_every": 6, "checkpoint_every": 6},
    )
    ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    progressed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        name = msg.subject.rsplit(".", 1)[-1]
        if name == "progress" and not progressed.done():
            progressed.set_result(None)
        if name in ("succeeded", "failed") and not ended.done():
            ended.set_result(f"{name}: {json.loads(msg.data)['data']}")

    nc = await nats.connect(settings.nats_url)
    # What the agent reports, on its own worker subject (the scheduler, absent here, would
    # republish it on the job's public events).
    await nc.subscribe(s.worker_event(job.worker_id, job.job_id, "*"), cb=on_event)
    app = build_app(settings)
    try:
        async with build_registry(settings), app:
            port = app.context.get("metrics_server").port
            idle = await asyncio.to_thread(scrape, port)
            assert sample(idle, "swarm_trainer_jobs_running") == 0
            assert sample(idle, "swarm_trainer_memory_total_bytes") > 0
            # The heartbeats the agent published.
            heartbeat = s.heartbeat("{worker}")
            assert sample(idle, "swarm_trainer_published_messages_total", destination=heartbeat)

            await publish_assignment(nc, s, job)
            await asyncio.wait_for(progressed, 240)
            running = await asyncio.to_thread(scrape, port)
            assert sample(running, "swarm_trainer_jobs_running") == 1
            assert sample(running, "swarm_trainer_tokens_per_second") > 0
            outcome = await asyncio.wait_for(ended, 240)
            assert outcome.startswith("succeeded"), outcome
            after = await asyncio.to_thread(scrape, port)
    finally:
        await nc.close()

    assert sample(after, "swarm_trainer_steps_total") == MAX_STEPS
    assert sample(after, "swarm_trainer_step_duration_seconds_count") == MAX_STEPS
    assert sample(after, "swarm_trainer_step_duration_seconds_sum") > 0
    assert sample(after, "swarm_trainer_checkpoints_total") == 2
    assert sample(after, "swarm_trainer_jobs_finished_total", outcome="succeeded") == 1
    assert sample(after, "swarm_trainer_jobs_running") == 0
    # Only running jobs count: the job ended, so the sum of their throughputs is back to 0.
    assert sample(after, "swarm_trainer_tokens_per_second") == 0
    assert 0 <= sample(after, "swarm_trainer_cpu_utilization_ratio") <= 1
    assert (
        0
        < sample(after, "swarm_trainer_memory_used_bytes")
        <= sample(after, "swarm_trainer_memory_total_bytes")
    )
    assign = s.assign("{worker}")
    assert sample(after, "swarm_trainer_received_messages_total", handler=assign) == 1
    progress = s.worker_event("{worker}", "{job}", "progress")
    assert sample(after, "swarm_trainer_published_messages_total", destination=progress) >= 1

"""An agent without store keys (``SWARM_STORE_ACCESS=signed``) trains a job to the end against
a real S3 server: base model, dataset, Ray Train's checkpoints, the result and the adapter all
go through the registry's grants for the attempt, and the registry registers the adapter."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.subjects import Subjects
from swarm_registry.app import build_app as build_registry
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_trainer.app import build_app
from swarm_trainer.settings import TrainerSettings

from ..conftest import S3Server
from ..registry.test_store_access import s3_settings
from .conftest import make_assignment
from .test_agent import Events, _terminal, publish_assignment

pytestmark = pytest.mark.slow


async def test_an_agent_without_store_keys_trains_checkpoints_and_registers(
    ray_cluster: None, settings: Settings, s3_server: S3Server, tiny_model_dir: Path
) -> None:
    s = Subjects(settings.namespace)
    cluster = s3_settings(settings, s3_server)  # the registry's: it holds the keys
    store = open_store(cluster)
    agent_settings = TrainerSettings.of(
        settings, worker_id="w-signed", heartbeat_interval_s=0.5, store_access="signed"
    )
    assert agent_settings.s3_access_key is None
    job = make_assignment(
        store, tiny_model_dir, worker_id="w-signed", training={"max_steps": 6}
    ).model_copy(update={"attempt_token": "the-attempts-token"})

    nc = await nats.connect(settings.nats_url)
    events = Events()

    async def on_event(msg: Any) -> None:
        events.items.append((msg.subject.rsplit(".", 1)[-1], json.loads(msg.data)["data"]))

    # What the agent reports, on its own worker subject (the scheduler, absent here, would
    # republish it on the job's public events).
    await nc.subscribe(s.worker_event(job.worker_id, job.job_id, "*"), cb=on_event)
    js = nc.jetstream()
    await ensure_topology(js, s)
    # The signer finds the job's dataset where the gateway put it.
    datasets = RecordTable(await kv_bucket(js, s, "datasets"), DatasetInfo)
    await datasets.put(f"{job.tenant}.{job.dataset.id}", job.dataset)
    jobs = RecordTable(await kv_bucket(js, s, "jobs"), JobRecord)

    registry, agent = build_registry(cluster), build_app(agent_settings)
    await registry.start()
    await agent.start()
    try:
        assert agent.agent.store is None  # type: ignore[attr-defined]
        await publish_assignment(nc, s, job)
        # The scheduler's part, which this test plays: the record follows `started`.
        await events.wait_for("started")
        found = await jobs.get(job.job_id)
        assert found is not None
        await jobs.put(job.job_id, found[0].model_copy(update={"state": JobState.running}))
        await asyncio.wait_for(_terminal(events), 180)
    finally:
        await agent.stop()
        await registry.stop()
        await nc.close()

    names = events.names()
    assert "succeeded" in names, events.items
    assert names.count("checkpoint") == 2
    checkpoint = next(d for n, d in events.items if n == "checkpoint")
    assert store.exists(checkpoint["store_key"] + "/adapter_model.safetensors")
    assert store.exists(f"checkpoints/{job.job_id}/attempt-1/checkpoint_manager_snapshot.json")
    done = await events.wait_for("succeeded", timeout=1)
    assert done["adapter"]["version"] == 1
    assert store.exists(done["adapter"]["store_key"] + "/adapter_model.safetensors")

"""Fencing: only the job's current attempt may register a version."""

from __future__ import annotations

from typing import Any

import nats

from swarm_common.jobs import JobRecord, JobSpec, JobState
from swarm_common.records import RecordTable
from swarm_common.settings import Settings
from swarm_common.store import ObjectStore
from swarm_common.subjects import Subjects
from swarm_common.topology import kv_bucket

from .test_adapters import register, upload_output


async def put_job(
    settings: Settings, job_id: str, attempt: int, state: JobState = JobState.running
) -> None:
    nc = await nats.connect(settings.nats_url)
    jobs = RecordTable(
        await kv_bucket(nc.jetstream(), Subjects(settings.namespace), "jobs"), JobRecord
    )
    spec = JobSpec(name="bot", base_model="tiny", dataset="ds-" + "a" * 24)
    await jobs.put(
        job_id,
        JobRecord(job_id=job_id, tenant="acme", spec=spec, state=state, attempt=attempt),
    )
    await nc.close()


async def test_a_stale_attempt_never_registers(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    await put_job(settings, "job-f", attempt=2)
    key = upload_output(store, "job-f", model_files)

    stale = await register(client, "bot", key, "job-f", attempt=1)
    assert not stale["ok"]
    assert "stale attempt" in stale["error"] and "attempt 2" in stale["error"]
    # Nothing was claimed or copied for the stale worker.
    assert (await client.call("adapters.list", {"name": "bot"}))["result"] == []
    assert store.list("adapters/") == []

    current = await register(client, "bot", key, "job-f", attempt=2)
    assert current["ok"], current
    assert current["result"]["version"] == 1
    # Once the version exists, the stale worker is still refused (not handed the version).
    again = await register(client, "bot", key, "job-f", attempt=1)
    assert not again["ok"] and "stale attempt" in again["error"]


async def test_a_job_without_a_record_may_register(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    reply = await register(client, "bot", upload_output(store, "job-n", model_files), "job-n")
    assert reply["ok"], reply

"""Fencing: only the job's current attempt may register a version."""

from __future__ import annotations

import json
from typing import Any

import nats

from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.providers import token_digest
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import Verification
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore
from swarm_runtime.topology import kv_bucket

from .test_adapters import lineage, register, upload_output


async def put_job(
    settings: Settings,
    job_id: str,
    attempt: int,
    state: JobState = JobState.running,
    token: str | None = None,
    verification: Verification | None = None,
    worker_id: str | None = None,
) -> None:
    nc = await nats.connect(settings.nats_url)
    jobs = RecordTable(
        await kv_bucket(nc.jetstream(), Subjects(settings.namespace), "jobs"), JobRecord
    )
    spec = JobSpec(name="bot", base_model="tiny", dataset="ds-" + "a" * 24)
    await jobs.put(
        job_id,
        JobRecord(
            job_id=job_id,
            tenant="acme",
            spec=spec,
            state=state,
            attempt=attempt,
            worker_id=worker_id,
            attempt_token_sha256=token_digest(token) if token else None,
            verification=verification,
        ),
    )
    await nc.close()


async def test_a_stale_attempt_never_registers(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    await put_job(settings, "job-f", attempt=2)
    key = upload_output(store, "job-f", model_files)

    stale = await register(client, "bot", key, "job-f", attempt=1)
    assert not stale["ok"]
    assert "stale attempt" in stale["error"]
    assert "attempt 2" in stale["error"]
    # Nothing was claimed or copied for the stale worker.
    assert (await client.call("adapters.list", {"name": "bot"}))["result"] == []
    assert store.list("adapters/") == []

    current = await register(client, "bot", key, "job-f", attempt=2)
    assert current["ok"], current
    assert current["result"]["version"] == 1
    # Once the version exists, the stale worker is still refused (not handed the version).
    again = await register(client, "bot", key, "job-f", attempt=1)
    assert not again["ok"]
    assert "stale attempt" in again["error"]


async def test_only_the_worker_holding_the_attempt_registers(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    """Another worker (a provider that knows the job id and attempt) cannot register an
    adapter for the job: it lacks the attempt's token, which only the assignment carried."""
    await put_job(settings, "job-t", attempt=1, token="the-assignments-token")
    key = upload_output(store, "job-t", model_files)
    request = {"name": "bot", "store_key": key, "lineage": lineage("job-t", attempt=1)}
    for token in (None, "guessed"):
        refused = await client.call("adapters.register", request | {"attempt_token": token})
        assert not refused["ok"]
        assert refused["code"] == "forbidden", refused
    assert store.list("adapters/") == []
    ok = await client.call(
        "adapters.register", request | {"attempt_token": "the-assignments-token"}
    )
    assert ok["ok"], ok


async def test_a_job_without_a_record_may_register(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    reply = await register(client, "bot", upload_output(store, "job-n", model_files), "job-n")
    assert reply["ok"], reply


async def test_a_worker_registers_only_for_the_attempt_it_holds(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    """On a worker's own subject (``swarm.workers.<id>.registry.adapters.register``, which
    NATS lets only that worker use) the registry knows who asks: another worker is refused
    even with the attempt's token (sniffed, say), and so is a job that has no record."""
    token = "the-assignments-token"
    await put_job(settings, "job-w", attempt=1, token=token, worker_id="w1")
    key = upload_output(store, "job-w", model_files)
    request = {"name": "bot", "store_key": key, "lineage": lineage("job-w", attempt=1)}
    request |= {"attempt_token": token}

    async def as_worker(worker: str, body: dict[str, Any]) -> dict[str, Any]:
        subject = client.subjects.worker_registry("adapters.register", worker)
        msg = await client.nc.request(subject, json.dumps(body).encode(), timeout=10)
        return json.loads(msg.data)

    refused = await as_worker("w2", request)
    assert refused["code"] == "forbidden", refused
    assert "not worker 'w2''s" in refused["error"]
    orphan = {"name": "bot", "store_key": key, "lineage": lineage("job-none", attempt=1)}
    refused = await as_worker("w1", orphan | {"attempt_token": token})
    assert refused["code"] == "forbidden", refused
    assert store.list("adapters/") == []
    ok = await as_worker("w1", request)
    assert ok["ok"], ok

"""Fencing: only the job's current attempt may register a version, and only its own: into the
job's tenant, under the job's adapter name, from the attempt's own output prefix."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest

from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.providers import token_digest
from swarm_contracts.registry import RegisterAdapter
from swarm_contracts.store_access import StoreAccess
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import Verification, VerifyTarget
from swarm_registry.attempt_holder import check_registration, check_store_access
from swarm_registry.errors import RegistryError
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
    tenant: str = "acme",
    worker_id: str | None = None,
    verify: VerifyTarget | None = None,
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
            tenant=tenant,
            spec=spec,
            worker_id=worker_id,
            verify=verify,
            state=state,
            attempt=attempt,
            attempt_token_sha256=token_digest(token) if token else None,
            verification=verification,
        ),
    )
    await nc.close()


async def test_a_stale_attempt_never_registers(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    await put_job(settings, "job-f", attempt=2)
    key = upload_output(store, "job-f", model_files, attempt=2)

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


async def test_a_provider_registers_only_its_own_job_s_adapter(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    """A provider holding job-own's attempt (and its token) cannot use it to register into
    another tenant, under another name, or from anything but the attempt's own output: not
    another job's output, not a dataset; nor with a made-up job id that has no record."""
    await put_job(settings, "job-own", attempt=1, token="own-token", worker_id="prov")
    await put_job(settings, "job-b", attempt=1, token="b-token", tenant="other", worker_id="w-b")
    own = upload_output(store, "job-own", model_files)
    others = upload_output(store, "job-b", model_files, seed=2)
    store.put_bytes("datasets/other/" + "c" * 64 + ".jsonl", b'{"text": "secret"}\n')
    dataset = "datasets/other/" + "c" * 64 + ".jsonl"

    def request(**change: Any) -> dict[str, Any]:
        job_id = change.pop("job_id", "job-own")
        body = {
            "name": change.pop("name", "bot"),
            "store_key": change.pop("store_key", own),
            "lineage": lineage(job_id, **change),
            "attempt_token": "own-token",
        }
        return body

    forged = {
        "another tenant": request(tenant="other"),
        "another name": request(name="jobb"),
        "another job's output": request(store_key=others),
        "a dataset": request(store_key=dataset),
        "another dataset": request(dataset="ds-" + "c" * 24),
        "a made-up parent": request(parent="loot@1"),
        "a made-up job's dataset": request(job_id="job-made-up", store_key=dataset),
        "a made-up job's copy of another output": request(job_id="job-made-up", store_key=others),
    }
    for what, body in forged.items():
        refused = await client.call("adapters.register", body)
        assert not refused["ok"], what
        assert refused["code"] == "forbidden", (what, refused)
    assert store.list("adapters/") == []
    assert (await client.call("adapters.list", {}))["result"] == []

    honest = await client.call("adapters.register", request())
    assert honest["ok"], honest
    assert (honest["result"]["tenant"], honest["result"]["name"]) == ("acme", "bot")


async def test_a_replay_job_registers_no_adapter(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    target = VerifyTarget(job_id="job-t", attempt=1, worker_id="w1", from_step=1, to_step=2)
    await put_job(settings, "job-replay", attempt=1, token="r", worker_id="w2", verify=target)
    key = upload_output(store, "job-replay", model_files)
    reply = await client.call(
        "adapters.register",
        {"name": "bot", "store_key": key, "lineage": lineage("job-replay"), "attempt_token": "r"},
    )
    assert reply["code"] == "forbidden", reply
    assert "replay" in reply["error"]


def _record(worker_id: str | None = "prov") -> JobRecord:
    return JobRecord(
        job_id="job-s",
        tenant="acme",
        spec=JobSpec(name="bot", base_model="tiny", dataset="ds-" + "a" * 24),
        state=JobState.running,
        attempt=1,
        worker_id=worker_id,
        attempt_token_sha256=token_digest("tok"),
    )


def test_a_known_sender_must_be_the_attempt_s_worker() -> None:
    """Where the subject says which worker sent a request, that worker must hold the attempt:
    a stolen token is not enough."""
    registration = RegisterAdapter.model_validate(
        {
            "name": "bot",
            "store_key": "outputs/job-s/1/adapter",
            "lineage": lineage("job-s"),
            "attempt_token": "tok",
        }
    )
    access = StoreAccess(job_id="job-s", attempt=1, attempt_token="tok", op="get", key="x")
    record = _record()
    for sender in (None, "prov"):
        check_registration(registration, record, sender)
        assert check_store_access(access, record, sender) is record
    with pytest.raises(RegistryError, match="not assigned to worker 'thief'") as raised:
        check_registration(registration, record, "thief")
    assert raised.value.code == "forbidden"
    with pytest.raises(RegistryError, match="not assigned to worker 'thief'"):
        check_store_access(access, record, "thief")
    # A worker may not register a job that has no record (imports are a service's).
    with pytest.raises(RegistryError, match="no job 'job-s'"):
        check_registration(registration, None, "prov")
    check_registration(registration, None, None)


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
    assert "not assigned to worker 'w2'" in refused["error"]
    orphan = {"name": "bot", "store_key": key, "lineage": lineage("job-none", attempt=1)}
    refused = await as_worker("w1", orphan | {"attempt_token": token})
    assert refused["code"] == "forbidden", refused
    assert store.list("adapters/") == []
    ok = await as_worker("w1", request)
    assert ok["ok"], ok

"""The store signer (``swarm.registry.store.access``) against a real S3 server: the current
attempt's token gets presigned URLs for its job's keys and nothing else."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from pydantic import SecretStr

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.jobs import JobRecord, JobSpec, JobState, ModelRef, ParentAdapter
from swarm_contracts.layout import dataset_key, token_cache_prefix, token_frame_key
from swarm_contracts.providers import token_digest
from swarm_contracts.sessions import SessionLease
from swarm_contracts.subjects import Subjects
from swarm_registry import build_app
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import S3Store, open_store
from swarm_runtime.topology import ensure_topology, kv_bucket

from ..conftest import S3Server

MODEL = "models/tiny/0123456789abcdef"
PARENT = "adapters/acme/bot/1"


def s3_settings(settings: Settings, server: S3Server) -> Settings:
    bucket = "swarm-" + uuid.uuid4().hex[:12]
    return settings.model_copy(
        update={
            "store_url": f"s3://{bucket}?endpoint={server.endpoint}",
            "s3_access_key": server.access_key,
            "s3_secret_key": SecretStr(server.secret_key),
        }
    )


@dataclass
class Jobs:
    """Two running jobs of two tenants, each with its dataset and an earlier attempt's
    checkpoint: ``job-a`` (attempt 2, token ``token-a``, trained from a parent adapter) and
    ``job-b`` (attempt 1, token ``token-b``)."""

    datasets: dict[str, str]  # job id -> its dataset's key


async def seed_jobs(settings: Settings, store: S3Store) -> Jobs:
    nc = await nats.connect(settings.nats_url)
    subjects = Subjects(settings.namespace)
    try:
        js = nc.jetstream()
        await ensure_topology(js, subjects)
        table = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)
        datasets_kv = RecordTable(await kv_bucket(js, subjects, "datasets"), DatasetInfo)
        for name in ("config.json", "model.safetensors"):
            store.put_bytes(f"{MODEL}/{name}", f"model {name}".encode())
        store.put_bytes(f"{PARENT}/adapter_model.safetensors", b"parent weights")
        datasets = {}
        for job_id, tenant, attempt in (("job-a", "acme", 2), ("job-b", "other", 1)):
            sha = job_id[-1] * 64
            info = DatasetInfo(
                id=dataset_id_for(sha),
                tenant=tenant,
                sha256=sha,
                store_key=dataset_key(tenant, sha),
                format="text",
                examples=1,
                bytes=20,
            )
            store.put_bytes(info.store_key, f'{{"text": "{job_id} data"}}\n'.encode())
            await datasets_kv.put(f"{tenant}.{info.id}", info)
            datasets[job_id] = info.store_key
            store.put_bytes(
                f"checkpoints/{job_id}/attempt-1/checkpoint_00000001/adapter_model.safetensors",
                f"{job_id} checkpoint".encode(),
            )
            parent = (
                ParentAdapter(name="bot", version=1, store_key=PARENT, files={})
                if job_id == "job-a"
                else None
            )
            await table.put(
                job_id,
                JobRecord(
                    job_id=job_id,
                    tenant=tenant,
                    spec=JobSpec(name="bot", base_model="tiny", dataset=info.id),
                    state=JobState.running,
                    attempt=attempt,
                    worker_id="w",
                    base_model=ModelRef(name="tiny", version=1, store_key=MODEL, digest="d"),
                    parent=parent,
                    attempt_token_sha256=token_digest(f"token-{job_id[-1]}"),
                ),
            )
        return Jobs(datasets=datasets)
    finally:
        await nc.close()


def tokens_key(tenant: str, digit: str) -> str:
    """A frame of the token cache of the dataset whose sha256 is ``digit`` 64 times."""
    prefix = token_cache_prefix(tenant, digit * 64, "0123456789abcdef", 64, "sft1-v1")
    return token_frame_key(prefix, 0)


class Signer:
    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self.nc, self.subjects = nc, subjects

    async def ask(
        self,
        op: str,
        key: str,
        job_id: str = "job-a",
        attempt: int = 2,
        token: str = "token-a",
        worker: str = "w",
    ) -> dict[str, Any]:
        request = {
            "job_id": job_id,
            "attempt": attempt,
            "attempt_token": token,
            "op": op,
            "key": key,
        }
        msg = await self.nc.request(
            # On the asking worker's own subject, as its NATS permissions allow.
            self.subjects.worker_registry("store.access", worker),
            json.dumps(request).encode(),
            timeout=10,
        )
        return json.loads(msg.data)

    async def url(self, op: str, key: str, **kw: Any) -> tuple[str, str]:
        reply = await self.ask(op, key, **kw)
        assert reply["ok"], reply
        return reply["result"]["method"], reply["result"]["url"]


@pytest.fixture
def s3(settings: Settings, s3_server: S3Server) -> Settings:
    return s3_settings(settings, s3_server)


@pytest.fixture
async def signer(s3: Settings) -> AsyncIterator[tuple[Signer, S3Store, Jobs]]:
    store = open_store(s3)
    assert isinstance(store, S3Store)
    jobs = await seed_jobs(s3, store)
    app = build_app(s3)
    await app.start()
    nc = await nats.connect(s3.nats_url)
    try:
        yield Signer(nc, Subjects(s3.namespace)), store, jobs
    finally:
        await nc.close()
        await app.stop()


async def test_the_current_attempt_reads_and_writes_its_own_keys(
    signer: tuple[Signer, S3Store, Jobs],
) -> None:
    ask, store, jobs = signer
    # The token cache of the job's training set (written by a worker with store keys).
    tokens = tokens_key("acme", "a")
    store.put_bytes(tokens, b"tokens")
    reads = {
        jobs.datasets["job-a"]: b'{"text": "job-a data"}\n',
        tokens: b"tokens",
        f"{MODEL}/model.safetensors": b"model model.safetensors",
        f"{PARENT}/adapter_model.safetensors": b"parent weights",
        # An earlier attempt's checkpoint: what a new attempt resumes from.
        "checkpoints/job-a/attempt-1/checkpoint_00000001/adapter_model.safetensors": (
            b"job-a checkpoint"
        ),
    }
    async with httpx.AsyncClient() as http:
        for key, data in reads.items():
            method, url = await ask.url("get", key)
            assert method == "GET"
            got = await http.get(url)
            assert (got.status_code, got.content) == (200, data), key
            # (A URL names one object: S3 and MinIO refuse it for another key, its signature
            # no longer holding. moto checks no signatures, so that is not tested here.)

        own = "checkpoints/job-a/attempt-2/checkpoint_00000003/adapter_model.safetensors"
        method, url = await ask.url("put", own)
        assert (await http.put(url, content=b"new weights")).status_code == 200
        assert store.get_bytes(own) == b"new weights"
        for key in ("checkpoints/job-a/attempt-2-resume/x.json", "outputs/job-a/2/result.json"):
            method, url = await ask.url("put", key)
            assert (await http.put(url, content=b"{}")).status_code == 200

        listed = await ask.ask("list", "checkpoints/job-a/")
        assert [o["key"] for o in listed["result"]["objects"]] == [
            "checkpoints/job-a/attempt-1/checkpoint_00000001/adapter_model.safetensors",
            "checkpoints/job-a/attempt-2-resume/x.json",
            own,
        ]
        head = await ask.ask("head", own)
        assert head["result"]["objects"] == [{"key": own, "size": len(b"new weights")}]
        missing = await ask.ask("head", "checkpoints/job-a/attempt-2/nothing")
        assert missing["ok"]
        assert missing["result"]["objects"] == []

        method, url = await ask.url("delete", own)
        assert method == "DELETE"
        assert (await http.delete(url)).status_code == 204
        assert not store.exists(own)


async def test_wrong_stale_and_foreign_requests_are_refused(
    signer: tuple[Signer, S3Store, Jobs],
) -> None:
    ask, _, jobs = signer
    dataset = jobs.datasets["job-a"]
    for token in ("token-b", "guessed", ""):
        refused = await ask.ask("get", dataset, token=token)
        assert refused["code"] == "forbidden", refused
    stale = await ask.ask("get", dataset, attempt=1)
    assert stale["code"] == "conflict", stale
    assert "stale attempt" in stale["error"]
    unknown = await ask.ask("get", dataset, job_id="job-zzz")
    assert unknown["code"] == "forbidden"
    # Another worker, even with the attempt's token (sniffed, say): the sender is the
    # worker its subject names, and the attempt is worker w's.
    foreign = await ask.ask("get", dataset, worker="w-other")
    assert foreign["code"] == "forbidden", foreign
    assert "not assigned to worker 'w-other'" in foreign["error"]

    # Job a's worker, with its own valid token, asking for job b's keys or anything else.
    for op, key in (
        ("get", jobs.datasets["job-b"]),
        ("list", "datasets/other/"),
        ("list", "datasets/"),
        ("get", "checkpoints/job-b/attempt-1/checkpoint_00000001/adapter_model.safetensors"),
        ("list", "checkpoints/"),
        ("list", "checkpoints/job-b/"),
        ("get", "models/other/0123456789abcdef/model.safetensors"),
        ("get", "adapters/acme/bot/2/adapter_model.safetensors"),
        ("get", "outputs/job-b/1/result.json"),
        ("get", tokens_key("other", "b")),  # job b's dataset's tokens
        ("get", tokens_key("acme", "b")),  # tokens of a dataset job a does not train on
        ("head", f"{MODEL}x/config.json"),  # a sibling prefix, not below the model's
        # A listing that is no directory would also list siblings ("job-ab", "…abcdefX").
        ("list", "checkpoints/job-a"),
        ("list", MODEL),
        ("list", jobs.datasets["job-a"]),
    ):
        refused = await ask.ask(op, key)
        assert refused["code"] == "forbidden", (op, key, refused)

    # Writes only below the attempt's own run, resume copy and outputs.
    for key in (
        dataset,
        f"{MODEL}/model.safetensors",
        f"{PARENT}/adapter_model.safetensors",
        "checkpoints/job-a/attempt-1/checkpoint_00000001/adapter_model.safetensors",
        "checkpoints/job-a/attempt-3/x",
        "checkpoints/job-a/x",
        "outputs/job-a/1/result.json",
        "adapters/acme/bot/9/adapter_model.safetensors",
        "checkpoints/job-b/attempt-1/x",
        # Read, never written: tokens this worker made would go unchecked into other jobs.
        tokens_key("acme", "a"),
    ):
        for op in ("put", "delete"):
            refused = await ask.ask(op, key)
            assert refused["code"] == "forbidden", (op, key, refused)

    bad = await ask.ask("get", "checkpoints/job-a/../job-b/x")
    assert bad["code"] == "invalid"


async def test_an_ended_job_gets_nothing(signer: tuple[Signer, S3Store, Jobs]) -> None:
    ask, _, jobs = signer
    table = RecordTable(await kv_bucket(ask.nc.jetstream(), ask.subjects, "jobs"), JobRecord)
    found = await table.get("job-a")
    assert found is not None
    await table.put("job-a", found[0].model_copy(update={"state": JobState.succeeded}))
    refused = await ask.ask("get", jobs.datasets["job-a"])
    assert refused["code"] == "conflict", refused


async def test_a_local_store_grants_nothing(client: Any) -> None:
    request = {"job_id": "job-a", "attempt": 1, "attempt_token": "t", "op": "get", "key": "x/y"}
    msg = await client.nc.request(
        client.subjects.worker_registry("store.access", "w"), json.dumps(request).encode(), 10
    )
    reply = json.loads(msg.data)
    assert reply["code"] == "invalid"
    assert "needs an S3 store" in reply["error"]


SESSION = "tsess-0123456789abcdef-train-0"
OTHER_SESSION = "tsess-fedcba9876543210-train-3"


def held_lease(worker: str, base: ModelRef, token: str) -> SessionLease:
    """SESSION's lease as the scheduler writes it: tenant acme, attempt 2, on ``worker``, the
    digest of ``token`` (the one its ``create`` call gave the worker)."""
    return SessionLease(
        session=SESSION,
        tenant="acme",
        worker_id=worker,
        attempt=2,
        cpus=1,
        gpus=0,
        base_model=base,
        attempt_token_sha256=token_digest(token),
    )


async def test_a_training_sessions_attempt_reads_its_tenants_saves_and_writes_its_own(
    signer: tuple[Signer, S3Store, Jobs],
) -> None:
    """A session's worker asks with the session's token as job id and its lease's attempt
    token: it reads its base model and its tenant's saves, and writes only its own saves and
    the outputs of its sampler saves (docs/tinker.md, *Placement*)."""
    ask, store, jobs = signer
    leases = RecordTable(
        await kv_bucket(ask.nc.jetstream(), ask.subjects, "session_leases"), SessionLease
    )
    lease = held_lease(
        "w", ModelRef(name="tiny", version=1, store_key=MODEL, digest="d"), "token-s"
    )
    await leases.put(SESSION, lease)
    theirs = f"tinker/acme/{OTHER_SESSION}/state/step-000004/adapter_model.safetensors"
    store.put_bytes(theirs, b"the tenant's other model")
    store.put_bytes(f"tinker/other/{OTHER_SESSION}/state/x/adapter_model.safetensors", b"no")
    mine = {"job_id": SESSION, "attempt": 2, "token": "token-s"}

    async with httpx.AsyncClient() as http:
        for key, data in (
            (f"{MODEL}/model.safetensors", b"model model.safetensors"),
            (theirs, b"the tenant's other model"),  # load_state may name any of its saves
        ):
            got = await http.get((await ask.url("get", key, **mine))[1])
            assert (got.status_code, got.content) == (200, data), key
        for key in (
            f"tinker/acme/{SESSION}/state/step-000002/adapter_model.safetensors",
            f"outputs/{SESSION}-s17/1/adapter/adapter_model.safetensors",
        ):
            url = (await ask.url("put", key, **mine))[1]
            assert (await http.put(url, content=b"w")).status_code == 200, key
        listed = await ask.ask("list", f"tinker/acme/{SESSION}/", **mine)
        assert [o["key"] for o in listed["result"]["objects"]] == [
            f"tinker/acme/{SESSION}/state/step-000002/adapter_model.safetensors"
        ]

    for op, key in (
        ("get", f"tinker/other/{OTHER_SESSION}/state/x/adapter_model.safetensors"),
        ("list", "tinker/"),
        ("get", jobs.datasets["job-a"]),
        ("get", "checkpoints/job-a/attempt-1/checkpoint_00000001/adapter_model.safetensors"),
        ("get", "adapters/acme/bot/1/adapter_model.safetensors"),
        ("put", theirs),  # another model's save: read, never written
        ("put", f"{MODEL}/model.safetensors"),
        ("put", f"outputs/{SESSION}-s17/2/x"),  # only the sampler save's attempt 1
        ("put", f"outputs/{SESSION}x-s17/1/x"),
        ("put", f"outputs/{OTHER_SESSION}-s1/1/x"),
        ("put", "outputs/job-a/2/result.json"),
    ):
        refused = await ask.ask(op, key, **mine)
        assert refused["code"] == "forbidden", (op, key, refused)

    saved = f"tinker/acme/{SESSION}/state/step-000002/adapter_model.safetensors"
    for wrong, code in (
        ({"token": "token-a"}, "forbidden"),  # a job's token is not the session's
        ({"worker": "w-other"}, "forbidden"),  # the lease is worker w's
        ({"attempt": 1}, "conflict"),
        ({"job_id": OTHER_SESSION}, "forbidden"),  # no lease
    ):
        refused = await ask.ask("get", saved, **(mine | wrong))
        assert refused["code"] == code, (wrong, refused)
    await leases.put(SESSION, lease.model_copy(update={"state": "ended"}))
    ended = await ask.ask("get", saved, **mine)
    assert ended["code"] == "conflict", ended

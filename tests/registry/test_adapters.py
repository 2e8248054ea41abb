"""Adapter registration: versions, idempotency per job, copies, announcements, tenant filters."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.registry import Lineage
from swarm_contracts.subjects import Subjects
from swarm_registry import build_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore

# Fixtures come from conftest.py: ``client`` (a RegistryClient), ``model_files`` (ModelFiles).


def lineage(job_id: str, tenant: str = "acme", attempt: int = 1, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "base_model": "tiny",
        "base_model_version": 1,
        "base_model_digest": "0" * 64,
        "dataset": "ds-" + "a" * 24,
        "dataset_digest": "b" * 64,
        "lora": LoraSpec(),
        "training": TrainingSpec(max_steps=10),
        "metrics": {"eval_loss": 1.5},
    }
    fields.update(extra)
    return Lineage(tenant=tenant, job_id=job_id, attempt=attempt, **fields).model_dump(mode="json")


def upload_output(
    store: ObjectStore, job_id: str, model_files: Any, seed: int = 1, attempt: int = 1
) -> str:
    prefix = f"outputs/{job_id}/{attempt}/adapter"
    store.put_bytes(f"{prefix}/adapter_config.json", json.dumps({"r": 8, "seed": seed}).encode())
    store.put_bytes(
        f"{prefix}/adapter_model.safetensors", model_files.safetensors({"lora_A": [seed, 4]})
    )
    return prefix


async def register(client: Any, name: str, store_key: str, job_id: str, **kw: Any) -> dict:
    return await client.call(
        "adapters.register",
        {"name": name, "store_key": store_key, "lineage": lineage(job_id, **kw)},
    )


async def test_versions_per_job_copies_and_announcement(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    announcements = await nc.jetstream().subscribe(
        subjects.adapter_registered("*"), stream=subjects.adapters_stream, ordered_consumer=True
    )

    first = await register(client, "bot", upload_output(store, "job-1", model_files), "job-1")
    assert first["ok"], first
    v1 = first["result"]
    assert (v1["version"], v1["tenant"], v1["store_key"]) == (1, "acme", "adapters/acme/bot/1")
    assert v1["lineage"]["job_id"] == "job-1"
    assert set(v1["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    for name, digest in v1["files"].items():
        assert store.sha256(f"adapters/acme/bot/1/{name}") == digest
        assert store.sha256(f"outputs/job-1/1/adapter/{name}") == digest

    # A retry of the same job (even with other files in its output) is the same version.
    retry_key = upload_output(store, "job-1", model_files, seed=3)
    retry = await register(client, "bot", retry_key, "job-1")
    assert retry["result"] == v1

    second = await register(client, "bot", upload_output(store, "job-2", model_files, 2), "job-2")
    assert second["result"]["version"] == 2
    assert store.list("adapters/acme/bot/2/") == [
        "adapters/acme/bot/2/adapter_config.json",
        "adapters/acme/bot/2/adapter_model.safetensors",
    ]

    events = [json.loads((await announcements.next_msg(timeout=5)).data) for _ in range(2)]
    assert [e["type"] for e in events] == ["swarm.adapter.registered"] * 2
    assert [e["source"] for e in events] == ["swarm/registry"] * 2
    assert [e["subject"] for e in events] == ["bot", "bot"]
    assert [e["data"]["version"] for e in events] == [1, 2]
    assert events[0]["data"]["files"] == v1["files"]
    # The retry announced nothing new.
    info = await nc.jetstream().stream_info(subjects.adapters_stream)
    assert info.state.messages == 2
    await nc.close()


async def test_racing_registrations_get_distinct_versions(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    # A second registry instance in the same queue group: the race is across processes too.
    other = build_app(settings)
    await other.start()
    try:
        jobs = [f"job-r{i}" for i in range(6)]
        keys = {job: upload_output(store, job, model_files, i + 1) for i, job in enumerate(jobs)}
        replies = await asyncio.gather(
            *(register(client, "racer", keys[job], job) for job in jobs),
            # The same job twice at once must still come out as one version.
            register(client, "racer", keys["job-r0"], "job-r0"),
        )
    finally:
        await other.stop()
    assert all(r["ok"] for r in replies), replies
    by_job = {r["result"]["lineage"]["job_id"]: r["result"]["version"] for r in replies[:6]}
    assert len(set(by_job.values())) == 6
    assert replies[6]["result"]["version"] == by_job["job-r0"]
    listed = await client.call("adapters.list", {"name": "racer"})
    assert sorted(a["version"] for a in listed["result"]) == sorted(by_job.values())


async def test_get_and_list_filter_by_tenant(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    for name, job, tenant in (
        ("shared", "job-a1", "alpha"),
        ("shared", "job-b1", "beta"),
        ("solo", "job-a2", "alpha"),
    ):
        key = upload_output(store, job, model_files)
        assert (await register(client, name, key, job, tenant=tenant))["ok"]

    got = await client.call("adapters.get", {"name": "shared", "version": 1, "tenant": "alpha"})
    assert got["result"]["tenant"] == "alpha"
    # Numbers are per tenant: beta's first "shared" is v1, whatever alpha has (a shared
    # counter would tell beta that alpha has one).
    beta = await client.call("adapters.get", {"name": "shared", "version": 1, "tenant": "beta"})
    assert beta["result"]["tenant"] == "beta"
    assert beta["result"]["store_key"] == "adapters/beta/shared/1"
    hidden = await client.call("adapters.get", {"name": "shared", "version": 2, "tenant": "beta"})
    assert not hidden["ok"]
    assert "unknown adapter 'shared'" in hidden["error"]
    latest_alpha = await client.call("adapters.get", {"name": "shared", "tenant": "alpha"})
    assert latest_alpha["result"]["version"] == 1
    # No tenant (internal callers): the one tenant that has it, else ambiguous.
    solo = await client.call("adapters.get", {"name": "solo"})
    assert solo["result"]["tenant"] == "alpha"
    ambiguous = await client.call("adapters.get", {"name": "shared"})
    assert not ambiguous["ok"]
    assert "ambiguous" in ambiguous["error"]

    alpha = await client.call("adapters.list", {"tenant": "alpha"})
    assert [(a["name"], a["version"]) for a in alpha["result"]] == [("shared", 1), ("solo", 1)]
    everyone = await client.call("adapters.list", {})
    assert len(everyone["result"]) == 3
    shared_beta = await client.call("adapters.list", {"name": "shared", "tenant": "beta"})
    assert [a["version"] for a in shared_beta["result"]] == [1]

    missing = await client.call("adapters.get", {"name": "nope"})
    assert missing["error"] == "unknown adapter 'nope'"


async def test_rejects_bad_adapter_input(client: Any, store: ObjectStore) -> None:
    store.put_bytes("outputs/job-p/1/adapter_model.bin", b"\x80\x04")
    reply = await register(client, "bot", "outputs/job-p/1", "job-p")
    assert not reply["ok"]
    assert "adapter_model.bin" in reply["error"]
    reply = await register(client, "bot", "outputs/job-e/1/adapter", "job-e")
    assert not reply["ok"]
    assert "no files" in reply["error"]
    reply = await register(client, "Bot!", "outputs/job-p/1", "job-x")
    assert not reply["ok"]
    assert "invalid adapter name" in reply["error"]
    reply = await register(client, "bot", "outputs/p", "job.1")
    assert not reply["ok"]
    assert "invalid job id" in reply["error"]

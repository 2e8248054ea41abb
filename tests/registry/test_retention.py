"""Deleting versions, and garbage collection of unreferenced store objects."""

from __future__ import annotations

from typing import Any

import nats

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.jobs import JobState
from swarm_contracts.layout import (
    TOKEN_LAYOUT,
    dataset_key,
    join_key,
    token_cache_prefix,
    token_frame_key,
)
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import Verification
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore
from swarm_runtime.topology import kv_bucket

from .test_adapters import register, upload_output
from .test_fencing import put_job

# A checkpoint file in a job's run for attempt 1 (see swarm_contracts.layout.run_key).
CKPT = "attempt-1/checkpoint_00000010/adapter_model.safetensors"


async def test_delete_is_refused_while_an_alias_holds_the_version(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    for job in ("job-1", "job-2"):
        assert (await register(client, "bot", upload_output(store, job, model_files), job))["ok"]
    await client.call("adapters.alias.set", {"name": "bot", "alias": "production", "version": 1})

    refused = await client.call("adapters.delete", {"name": "bot", "version": 1})
    assert not refused["ok"]
    assert "alias 'production'" in refused["error"]
    assert refused["code"] == "conflict"
    assert store.list("adapters/acme/bot/1/")

    other_tenant = await client.call(
        "adapters.delete", {"name": "bot", "version": 2, "tenant": "z"}
    )
    assert other_tenant["error"] == "unknown adapter 'bot' version 2"
    assert other_tenant["code"] == "not_found"

    deleted = await client.call("adapters.delete", {"name": "bot", "version": 2, "tenant": "acme"})
    assert deleted["ok"]
    assert deleted["result"]["version"] == 2
    assert store.list("adapters/acme/bot/2/") == []
    gone = await client.call("adapters.get", {"name": "bot", "version": 2})
    assert gone["error"] == "unknown adapter 'bot' version 2"
    # A late retry of the deleted version's job does not bring it back.
    retry = await register(client, "bot", "outputs/job-2/1/adapter", "job-2")
    assert not retry["ok"]
    assert "was deleted" in retry["error"]
    # Move the alias away, then v1 can go too.
    assert (await register(client, "bot", upload_output(store, "job-3", model_files), "job-3"))[
        "ok"
    ]
    await client.call("adapters.alias.set", {"name": "bot", "alias": "production", "version": 3})
    assert (await client.call("adapters.delete", {"name": "bot", "version": 1}))["ok"]


async def test_gc_removes_only_unreferenced_objects(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    # A registered model and a re-upload of the same files (no new version: unreferenced).
    model_files.upload("models/tiny/a")
    model_files.upload("models/tiny/b")
    for key in ("models/tiny/a", "models/tiny/b"):
        assert (await client.call("models.register", {"name": "tiny", "store_key": key}))["ok"]
    # One finished job with outputs and checkpoints, one still running.
    for job, state in (("job-done", JobState.succeeded), ("job-live", JobState.running)):
        await put_job(settings, job, attempt=1, state=state)
        upload_output(store, job, model_files)
        # Attempt 1's Ray run, and attempt 2's copy of the checkpoint it resumed from.
        store.put_bytes(f"checkpoints/{job}/{CKPT}", b"c")
        store.put_bytes(f"checkpoints/{job}/attempt-2-resume/adapter_model.safetensors", b"c")
    # A finished job being verified: a replay starts from its checkpoints and compares.
    pending = Verification(replay_job_id="job-replay", attempt=1, from_step=4, to_step=6)
    await put_job(settings, "job-checked", 1, JobState.succeeded, verification=pending)
    store.put_bytes(f"checkpoints/job-checked/{CKPT}", b"c")
    assert (await register(client, "bot", "outputs/job-done/1/adapter", "job-done"))["ok"]
    # Adapter files no record refers to (a version deleted by hand from the KV, say).
    store.put_bytes("adapters/acme/bot/7/adapter_config.json", b"{}")

    spared = await client.call("gc.run", {})  # default min_age_s: everything here is young
    assert spared["result"]["adapters"] == []
    assert spared["result"]["models"] == []
    # Finished jobs' outputs and checkpoints do not wait for an age; running ones stay.
    assert spared["result"]["outputs"] == [
        "outputs/job-done/1/adapter/adapter_config.json",
        "outputs/job-done/1/adapter/adapter_model.safetensors",
    ]
    assert sorted(spared["result"]["checkpoints"]) == [
        f"checkpoints/job-done/{CKPT}",
        "checkpoints/job-done/attempt-2-resume/adapter_model.safetensors",
    ]

    dry = await client.call("gc.run", {"dry_run": True, "min_age_s": 0})
    assert dry["result"]["adapters"] == ["adapters/acme/bot/7/adapter_config.json"]
    assert store.exists("adapters/acme/bot/7/adapter_config.json")

    report = (await client.call("gc.run", {"min_age_s": 0}))["result"]
    assert report["adapters"] == ["adapters/acme/bot/7/adapter_config.json"]
    assert report["checkpoints"] == report["outputs"] == []  # gone in the first run
    assert sorted(report["models"]) == [
        "models/tiny/b/config.json",
        "models/tiny/b/model.safetensors",
        "models/tiny/b/tokenizer.json",
    ]
    # What is referenced or still in use is all there.
    assert len(store.list("models/tiny/a/")) == 3
    assert len(store.list("adapters/acme/bot/1/")) == 2
    assert store.list("outputs/job-live/")
    assert store.list("checkpoints/job-live/")
    assert store.list("checkpoints/job-checked/")
    assert store.list("outputs/job-done/") == []
    assert store.list("checkpoints/job-done/") == []
    assert not store.exists("adapters/acme/bot/7/adapter_config.json")
    # The registered adapter still verifies after the collection.
    verified = await client.call("adapters.verify", {"name": "bot", "version": 1})
    assert verified["result"]["ok"] is True


async def test_gc_removes_the_token_cache_of_a_deleted_dataset(
    client: Any, store: ObjectStore, settings: Settings
) -> None:
    nc = await nats.connect(settings.nats_url)
    datasets = RecordTable(
        await kv_bucket(nc.jetstream(), Subjects(settings.namespace), "datasets"), DatasetInfo
    )
    kept, deleted, in_use = "b" * 64, "c" * 64, "a" * 64  # job-live trains on ds-aaa…
    for sha in (kept, deleted):
        info = DatasetInfo(
            id=dataset_id_for(sha),
            tenant="acme",
            sha256=sha,
            store_key=dataset_key("acme", sha),
            format="text",
            examples=2,
            bytes=10,
        )
        await datasets.put(f"acme.{info.id}", info)
    await put_job(settings, "job-live", attempt=1, state=JobState.running)
    entry = "0123456789abcdef-s64-sft1-v1"

    def tokens(tenant: str, sha: str) -> list[str]:
        prefix = token_cache_prefix(tenant, sha, "0123456789abcdef", 64, "sft1-v1")
        assert prefix.endswith(entry)
        keys = [join_key(prefix, TOKEN_LAYOUT), token_frame_key(prefix, 0)]
        for key in keys:
            store.put_bytes(key, b"t")
        return keys

    live, gone, used = tokens("acme", kept), tokens("acme", deleted), tokens("acme", in_use)
    other_tenant = tokens("zeta", kept)  # same data, another tenant's: no record there
    # The gateway deletes a dataset by forgetting its record.
    await datasets.delete(f"acme.{dataset_id_for(deleted)}")

    report = (await client.call("gc.run", {"min_age_s": 0}))["result"]
    assert sorted(report["tokens"]) == sorted(gone + other_tenant)
    assert all(store.exists(key) for key in live + used)
    assert not any(store.exists(key) for key in gone + other_tenant)
    await nc.close()

"""``from_checkpoint`` and pause/resume at the gateway, over the real registry and scheduler:
only the caller's own job's committed checkpoint can be forked, and a refusal names the field
with the status that says why (404: no such job of theirs; 409: no such checkpoint; 422: a
checkpoint of another base model); pausing what is not running, or resuming what is not
paused, is a 409."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from swarm import AsyncClient, NotFoundError, ValidationError
from swarm_contracts.jobs import (
    JobRecord,
    JobSpec,
    JobState,
    LoraSpec,
    ModelRef,
    job_id_for,
)
from swarm_contracts.layout import (
    SNAPSHOT_FILE,
    checkpoint_dir_name,
    checkpoint_prefix,
    fork_key,
    run_key,
)
from swarm_contracts.subjects import Subjects
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, open_store, sha256_file
from swarm_runtime.topology import kv_bucket

from ..conftest import ServerThread
from ..scheduler.conftest import write_fake_model
from .conftest import ADMIN, ALICE, BOB

SOURCE = job_id_for("alice", "source")
# A decoder's numbers, so that the registry knows the model's shape (for the memory estimate).
LLAMA = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def commit(store: ObjectStore, root: Path, attempt: int, *steps: int) -> None:
    """The checkpoints of the source's attempt as Ray Train leaves them: directories (a PEFT
    adapter and the training state) and the run's snapshot listing them as committed."""
    names = [checkpoint_dir_name(s) for s in steps]
    for step, name in zip(steps, names, strict=True):
        directory = root / name
        directory.mkdir(parents=True)
        (directory / "adapter_config.json").write_text(json.dumps({"r": 4, "step": step}))
        (directory / "adapter_model.safetensors").write_bytes(f"weights {step}".encode())
        (directory / "optimizer.safetensors").write_bytes(b"moments")
        store.upload_dir(directory, checkpoint_prefix(SOURCE, attempt, step))
    snapshot = {
        "checkpoint_results": [{"checkpoint_dir_name": n} for n in names],
        "latest_checkpoint_result": {"checkpoint_dir_name": names[-1]},
    }
    store.put_bytes(f"{run_key(SOURCE, attempt)}/{SNAPSHOT_FILE}", json.dumps(snapshot).encode())


async def source_job(settings: Settings, tmp_path: Path, dataset: str) -> None:
    """alice's job that ran on ``tiny@1`` with r=4, and committed steps 4 and 8."""
    store = open_store(settings)
    await asyncio.to_thread(commit, store, tmp_path / "ckpt", 1, 4, 8)
    nc = await nats.connect(settings.nats_url)
    try:
        subjects = Subjects(settings.namespace)
        jobs = RecordTable(await kv_bucket(nc.jetstream(), subjects, "jobs"), JobRecord)
        spec = JobSpec(name="bot", base_model="tiny", dataset=dataset, lora=LoraSpec(r=4))
        record = JobRecord(
            job_id=SOURCE,
            tenant="alice",
            spec=spec,
            state=JobState.succeeded,
            attempt=1,
            worker_id="w1",
            base_model=ModelRef(name="tiny", version=1, store_key="models/tiny/x", digest="d"),
        )
        await jobs.create(SOURCE, record)
    finally:
        await nc.close()


async def test_a_job_forks_only_its_tenant_s_committed_checkpoints(
    tenant_stack: ServerThread, settings: Settings, tmp_path: Path
) -> None:
    url = tenant_stack.url
    write_fake_model(tmp_path / "model", LLAMA)
    async with AsyncClient(url, api_key=ADMIN) as admin:
        await admin.add_model("tiny", tmp_path / "model")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))

    async with AsyncClient(url, api_key=ALICE) as alice, AsyncClient(url, api_key=BOB) as bob:
        ds_alice = (await alice.upload_dataset(data)).id
        ds_bob = (await bob.upload_dataset(data)).id
        await source_job(settings, tmp_path, ds_alice)
        spec = {"name": "fork", "base_model": "tiny", "dataset": ds_alice}

        # bob cannot fork alice's job, nor learn that it exists.
        with pytest.raises(NotFoundError, match=f"job {SOURCE} not found for tenant bob") as gone:
            await bob.submit(spec | {"dataset": ds_bob}, from_checkpoint=f"{SOURCE}@8")
        assert gone.value.detail[0]["loc"] == ["body", "from_checkpoint"]
        unknown = job_id_for("alice", "never")
        with pytest.raises(NotFoundError, match="not found"):
            await alice.submit(spec, from_checkpoint=f"{unknown}@8")
        # A step with no committed checkpoint: a conflict with what the job has.
        with pytest.raises(ValidationError, match="no committed checkpoint at step 6") as none:
            await alice.submit(spec, from_checkpoint=f"{SOURCE}@6")
        assert none.value.status_code == 409
        assert none.value.detail[0]["loc"] == ["body", "from_checkpoint"]
        # A checkpoint of another base model version than the job names.
        with pytest.raises(ValidationError, match=r"trained on tiny@1, not on tiny@2") as other:
            await alice.submit(spec | {"base_model": "tiny@2"}, from_checkpoint=f"{SOURCE}@8")
        assert other.value.status_code == 422
        # Both starting points: refused by the spec's own validation.
        with pytest.raises(ValidationError, match="exclude each other"):
            await alice.submit(
                spec | {"from_adapter": "bot@1", "from_checkpoint": f"{SOURCE}@8"}, "both"
            )

        # The memory estimate already has the source's LoRA shape (r=4, not the asked 16).
        wide = {"lora": {"r": 16}}
        forked = await alice.estimate(spec | wide | {"from_checkpoint": f"{SOURCE}@4"})
        assert forked == await alice.estimate(spec | {"lora": {"r": 4}})
        assert forked != await alice.estimate(spec | wide)

        record = await alice.submit(
            spec | {"lora": {"r": 16, "dropout": 0.2}},
            idempotency_key="fork",
            from_checkpoint=f"{SOURCE}@4",
            from_checkpoint_optimizer=True,
        )
    fork = record.fork
    assert fork is not None
    assert (fork.job_id, fork.attempt, fork.step, fork.optimizer) == (SOURCE, 1, 4, True)
    assert fork.ref == f"{SOURCE}@4"
    # The source's LoRA shape (its checkpoint has it), the job's own dropout.
    assert (record.spec.lora.r, record.spec.lora.dropout) == (4, 0.2)
    assert record.base_model is not None
    assert (record.base_model.name, record.base_model.version) == ("tiny", 1)
    # The registry copied the checkpoint among the fork's own, hashed as the trainer checks.
    assert fork.store_key == fork_key(record.job_id)
    store = open_store(settings)
    copy = tmp_path / "copy"
    await asyncio.to_thread(store.download_dir, fork.store_key, copy)
    assert (copy / "adapter_model.safetensors").read_bytes() == b"weights 4"
    assert (copy / "optimizer.safetensors").read_bytes() == b"moments"
    assert fork.files == {
        name: sha256_file(copy / name)
        for name in ("adapter_config.json", "adapter_model.safetensors")
    }


async def test_pause_and_resume_refuse_what_they_cannot_do(
    tenant_stack: ServerThread, tmp_path: Path
) -> None:
    url = tenant_stack.url
    write_fake_model(tmp_path / "model")
    async with AsyncClient(url, api_key=ADMIN) as admin:
        await admin.add_model("tiny", tmp_path / "model")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
    async with AsyncClient(url, api_key=ALICE) as alice, AsyncClient(url, api_key=BOB) as bob:
        dataset = (await alice.upload_dataset(data)).id
        queued = await alice.submit({"name": "bot", "base_model": "tiny", "dataset": dataset})
        assert queued.state == JobState.queued  # no worker: it stays so

        with pytest.raises(ValidationError, match="queued, not running") as not_running:
            await alice.pause_job(queued.job_id)
        assert not_running.value.status_code == 409
        with pytest.raises(ValidationError, match="not paused") as not_paused:
            await alice.resume_job(queued.job_id)
        assert not_paused.value.status_code == 409
        for call in (bob.pause_job, bob.resume_job):
            with pytest.raises(NotFoundError):
                await call(queued.job_id)
        with pytest.raises(NotFoundError):
            await alice.pause_job(job_id_for("alice", "nothing"))

        await alice.cancel(queued.job_id)
        ended = await alice.wait(queued.job_id, timeout=10, poll_s=0.1)
        assert ended.state == JobState.cancelled
        with pytest.raises(ValidationError, match="nothing to pause"):
            await alice.pause_job(queued.job_id)

"""One LoRA job end to end: HTTP in, five real services, a registered adapter out."""

from __future__ import annotations

import asyncio
import hashlib
import time

import nats
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from swarm.errors import NotFoundError, ValidationError
from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobSpec, JobState, JobSubmission
from swarm_contracts.subjects import Subjects
from swarm_runtime.store import LocalStore

from .conftest import Stack

pytestmark = pytest.mark.slow

MAX_STEPS = 12


def spec(stack: Stack, **overrides: object) -> dict:
    return {
        "name": "e2e-adapter",
        "base_model": "tiny-llama",
        "dataset": stack.train.id,
        "validation": stack.validation.id,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "max_steps": MAX_STEPS,
            "batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 2,
            "seq_len": 64,
            "eval_every": 6,
            "checkpoint_every": 6,
        },
    } | overrides


def test_a_job_trains_and_registers_an_adapter_with_its_lineage(stack: Stack, tmp_path) -> None:
    client = stack.client
    first = client.submit(spec(stack), idempotency_key="e2e-main")
    again = client.submit(spec(stack), idempotency_key="e2e-main")
    assert again.job_id == first.job_id
    assert [j.job_id for j in client.list_jobs(name="e2e-adapter")[0]] == [first.job_id]

    record = client.wait(first.job_id, timeout=420)
    assert record.state == JobState.succeeded, record.reason
    assert record.attempt == 1
    assert record.worker_id == "e2e-worker"
    assert record.adapter is not None
    assert record.adapter.version == 1

    # The registry's version, lineage and digests match what is in the store.
    adapter = client.get_adapter("e2e-adapter", 1)
    assert adapter.store_key == record.adapter.store_key == "adapters/default/e2e-adapter/1"
    lineage = adapter.lineage
    assert (lineage.job_id, lineage.attempt, lineage.tenant) == (first.job_id, 1, "default")
    assert (lineage.base_model, lineage.base_model_version) == ("tiny-llama", stack.model.version)
    assert lineage.base_model_digest == stack.model.digest
    assert lineage.dataset == stack.train.id
    assert lineage.dataset_digest == stack.train.sha256
    assert lineage.validation_dataset == stack.validation.id
    assert lineage.lora.r == 4
    assert lineage.training.max_steps == MAX_STEPS
    assert lineage.worker_id == "e2e-worker"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(adapter.files)
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in adapter.files)
    store = LocalStore(stack.local.store_dir)
    for name, sha in adapter.files.items():
        assert store.sha256(f"{adapter.store_key}/{name}") == sha
    # The training set streamed from the store and was tokenized once: its token cache entry
    # (the layout, and the frame the job tokenized) is there for the next job on it.
    # Other tests of the session train on the same set in other ways (other seq_len, DPO), each
    # its own entry: this job's is the one for its seq_len and SFT's encoding.
    cached = store.list(f"tokens/default/{stack.train.sha256}/")
    entries: dict[str, list[str]] = {}
    for key in cached:
        entry, name = key.rsplit("/", 2)[-2:]
        entries.setdefault(entry, []).append(name)
    mine = [e for e in entries if "-s64-sft1" in e]
    assert len(mine) == 1, entries
    assert sorted(entries[mine[0]]) == ["frame-000000.safetensors.zst", "layout.json"]

    # The adapter loads onto the base model with PEFT and changes what the model says.
    adapter_dir = tmp_path / "adapter"
    store.download_dir(adapter.store_key, adapter_dir)
    base = AutoModelForCausalLM.from_pretrained(stack.model_dir, use_safetensors=True)
    tuned = PeftModel.from_pretrained(base, adapter_dir)
    tuned.eval()
    ids = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        with tuned.disable_adapter():
            base_logits = tuned(input_ids=ids).logits
        tuned_logits = tuned(input_ids=ids).logits
    assert not torch.allclose(base_logits, tuned_logits, atol=1e-4)

    # A merged export (made by a trainer agent) answers exactly like base + adapter.
    with pytest.raises(NotFoundError, match="not exported"):
        client.download_export("e2e-adapter", 1, tmp_path / "early")
    export = client.export_adapter("e2e-adapter", 1)
    assert export.store_key == "exports/default/e2e-adapter/1"
    assert (export.adapter, export.base_model) == (
        "e2e-adapter@1",
        f"tiny-llama@{stack.model.version}",
    )
    for name, sha in export.files.items():
        assert store.sha256(f"{export.store_key}/{name}") == sha
    got = client.download_export("e2e-adapter", 1, tmp_path / "merged")  # checked by sha256
    assert sorted(p.name for p in got) == sorted(export.files)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", use_safetensors=True)
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, tuned_logits, atol=1e-4)
    # The registry's "unknown adapter" reaches the caller through the trainer as a 404.
    with pytest.raises(NotFoundError, match="unknown adapter"):
        client.export_adapter("e2e-adapter", 99)

    # Every step of the way was an event, in order.
    events = list(client.events(first.job_id))
    names = [e.event for e in events]
    assert names[:3] == ["queued", "assigned", "started"]
    assert names[-1] == "succeeded"
    # The worker's list of the committed checkpoints Ray keeps (the last two) is the record's.
    assert events[-1].payload["checkpoints"] == record.checkpoints == [6, 12]
    assert names.count("progress") == MAX_STEPS
    assert names.count("checkpoint") >= MAX_STEPS // 6
    assert names.count("validated") >= 2

    # Telemetry kept the loss curve.
    metrics = client.metrics(first.job_id)
    assert [p.step for p in metrics.train] == list(range(1, MAX_STEPS + 1))
    assert metrics.eval
    assert metrics.eval[-1].step == MAX_STEPS
    assert record.metrics["eval_loss"] == pytest.approx(metrics.eval[-1].eval_loss)


def test_an_unknown_base_model_is_refused_up_front_and_fails_a_nats_submission(
    stack: Stack,
) -> None:
    # At the gateway: a 422 naming the field, and no job.
    with pytest.raises(ValidationError, match="unknown base model no-such-model"):
        stack.client.submit(spec(stack, base_model="no-such-model"), idempotency_key="e2e-bad")
    # Straight onto swarm.jobs.submit (no gateway to check it): the job fails with the reason.
    key = "e2e-bad-over-nats"
    job_id = "job-" + hashlib.sha256(f"default\x00{key}".encode()).hexdigest()[:20]
    body = envelope(
        "e2e",
        "swarm.job.submit",
        JobSubmission(
            tenant="default", spec=JobSpec.model_validate(spec(stack, base_model="no-such-model"))
        ),
    )

    async def publish() -> None:
        nc = await nats.connect(stack.local.nats_url)
        try:
            subject = Subjects(stack.namespace).submit
            await nc.jetstream().publish(
                subject, body.model_dump_json().encode(), headers={"Nats-Msg-Id": key}
            )
        finally:
            await nc.close()

    asyncio.run(publish())
    # The scheduler makes the record once it has read the message.
    deadline = time.monotonic() + 60
    while True:
        try:
            stack.client.get_job(job_id)
            break
        except NotFoundError:
            assert time.monotonic() < deadline, "the scheduler never recorded the job"
            time.sleep(0.2)
    record = stack.client.wait(job_id, timeout=60)
    assert record.state == JobState.failed
    assert "no-such-model" in (record.reason or "")
    events = list(stack.client.events(record.job_id))
    assert [e.event for e in events] == ["queued", "failed"]
    assert "no-such-model" in events[-1].payload["reason"]

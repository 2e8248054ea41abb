"""``from_adapter`` at the gateway: only the caller's own adapter, on the job's base model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from swarm import AsyncClient, ValidationError
from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.registry import Lineage, RegisterAdapter
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store

from ..conftest import ServerThread
from ..scheduler.conftest import write_fake_model
from .conftest import ADMIN, ALICE, BOB


async def register_alice_adapter(settings: Settings, tmp_path: Path) -> None:
    """alice's ``bot@1``, trained on ``tiny@1`` (registered as an import: no job record)."""
    source = tmp_path / "adapter"
    source.mkdir()
    (source / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (source / "adapter_model.safetensors").write_bytes(b"weights")
    key = "outputs/import-1/1/adapter"
    await asyncio.to_thread(open_store(settings).upload_dir, source, key)
    lineage = Lineage(
        tenant="alice",
        job_id="import-1",
        attempt=1,
        base_model="tiny",
        base_model_version=1,
        base_model_digest="d" * 64,
        dataset="ds-" + "0" * 24,
        dataset_digest="0" * 64,
        lora=LoraSpec(r=4),
        training=TrainingSpec(),
    )
    nc = await nats.connect(settings.nats_url)
    try:
        reply = await nc.request(
            Subjects(settings.namespace).registry("adapters.register"),
            RegisterAdapter(name="bot", store_key=key, lineage=lineage).model_dump_json().encode(),
            timeout=10,
        )
    finally:
        await nc.close()
    assert json.loads(reply.data)["ok"], reply.data


async def test_only_the_caller_s_adapter_on_the_job_s_base_model_is_accepted(
    tenant_stack: ServerThread, settings: Settings, tmp_path: Path
) -> None:
    url = tenant_stack.url
    write_fake_model(tmp_path / "model")
    async with AsyncClient(url, api_key=ADMIN) as admin:
        await admin.add_model("tiny", tmp_path / "model")
    await register_alice_adapter(settings, tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))

    async with AsyncClient(url, api_key=ALICE) as alice, AsyncClient(url, api_key=BOB) as bob:
        spec = {"name": "bot", "base_model": "tiny", "from_adapter": "bot@1"}
        ds_alice = (await alice.upload_dataset(data)).id
        ds_bob = (await bob.upload_dataset(data)).id

        # bob cannot continue alice's adapter, nor learn that it exists.
        with pytest.raises(ValidationError, match="bot@1 not found for tenant bob"):
            await bob.submit(spec | {"dataset": ds_bob}, idempotency_key="b")
        with pytest.raises(ValidationError, match=r"trained on tiny@1, not on tiny@2"):
            await alice.submit(spec | {"dataset": ds_alice, "base_model": "tiny@2"}, "a0")

        record = await alice.submit(spec | {"dataset": ds_alice}, idempotency_key="a1")
        assert record.parent is not None
        assert record.parent.ref == "bot@1"
        assert record.spec.lora.r == 4  # the parent's shape, not the default 8

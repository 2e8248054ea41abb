"""``from_adapter``: the scheduler pins the tenant's parent adapter through the real registry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from swarm_contracts.jobs import JobState, LoraSpec, TrainingSpec, job_id_for
from swarm_contracts.registry import Lineage, RegisterAdapter
from swarm_runtime.store import open_store

from .conftest import Harness

PARENT_LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


async def register_adapter(
    harness: Harness,
    tmp_path: Path,
    tenant: str = "a",
    base_model: str = "tiny",
    base_version: int = 1,
) -> dict:
    """An adapter version made outside the scheduler (a job with no record is allowed)."""
    source = tmp_path / f"adapter-{tenant}-{base_model}"
    source.mkdir()
    (source / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (source / "adapter_model.safetensors").write_bytes(b"weights")
    store = open_store(harness.settings)
    key = f"outputs/import-{tenant}-{base_model}/1/adapter"
    await asyncio.to_thread(store.upload_dir, source, key)
    lineage = Lineage(
        tenant=tenant,
        job_id=f"import-{tenant}-{base_model}",
        attempt=1,
        base_model=base_model,
        base_model_version=base_version,
        base_model_digest="d" * 64,
        dataset="ds-" + "0" * 24,
        dataset_digest="0" * 64,
        lora=LoraSpec.model_validate(PARENT_LORA),
        training=TrainingSpec(),
    )
    request = RegisterAdapter(name="bot", store_key=key, lineage=lineage)
    reply = await harness.nc.request(
        harness.subjects.registry("adapters.register"),
        request.model_dump_json().encode(),
        timeout=10,
    )
    answer = json.loads(reply.data)
    assert answer["ok"], answer
    return answer["result"]


async def failed_reason(harness: Harness, key: str, tenant: str) -> str:
    job_id = job_id_for(tenant, key)
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.failed)
    events = await harness.events(job_id)
    assert [e["data"]["event"] for e in events] == ["queued", "failed"]
    assert events[-1]["data"]["reason"] == record.reason
    return record.reason or ""


async def test_a_job_continues_from_the_tenant_s_adapter_pinned_with_its_files(
    harness: Harness, tmp_path: Path
) -> None:
    parent = await register_adapter(harness, tmp_path)
    alias = await harness.nc.request(
        harness.subjects.registry("adapters.alias.set"),
        json.dumps({"name": "bot", "alias": "production", "version": 1}).encode(),
        timeout=10,
    )
    assert json.loads(alias.data)["ok"]

    # An alias is resolved once, at submission: the job names the version from then on.
    spec = harness.spec(from_adapter="bot@production", lora={"r": 16, "dropout": 0.2})
    await harness.submit(spec, msg_id="k", tenant="a")
    job_id = job_id_for("a", "k")
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.queued)
    assert record.parent is not None
    assert (record.parent.ref, record.parent.store_key) == ("bot@1", parent["store_key"])
    assert record.parent.files == parent["files"]
    # The LoRA shape is the parent's; dropout, a training setting, stays the job's.
    assert record.spec.lora.model_dump() == PARENT_LORA | {"dropout": 0.2, "quantize": None}
    assert record.spec.from_adapter == "bot@production"

    await harness.heartbeat("w1")
    await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    [assignment] = await harness.assignments("w1")
    assert assignment["parent"]["name"] == "bot"
    assert assignment["parent"]["version"] == 1
    assert assignment["parent"]["files"] == parent["files"]
    assert assignment["spec"]["lora"]["r"] == 4
    queued = (await harness.events(job_id))[0]["data"]
    assert queued["spec"]["lora"]["r"] == 4  # what the job runs with is visible to followers


@pytest.mark.parametrize(
    ("from_adapter", "tenant", "expected"),
    [
        ("nobody@1", "a", "unknown adapter 'nobody'"),
        ("bot@7", "a", "unknown adapter 'bot' version 7"),
        ("bot@1", "b", "unknown adapter 'bot' version 1"),  # another tenant's: looks unknown
        ("bot@production", "a", "unknown adapter 'bot' alias 'production'"),
    ],
)
async def test_an_unknown_or_foreign_parent_fails_the_job_with_a_reason(
    harness: Harness, tmp_path: Path, from_adapter: str, tenant: str, expected: str
) -> None:
    await register_adapter(harness, tmp_path, tenant="a")
    await harness.submit(harness.spec(from_adapter=from_adapter), msg_id="k", tenant=tenant)
    reason = await failed_reason(harness, "k", tenant)
    assert expected in reason
    assert from_adapter in reason


@pytest.mark.parametrize(("model", "version"), [("other", 1), ("tiny", 2)])
async def test_a_parent_trained_on_another_base_model_fails_the_job(
    harness: Harness, tmp_path: Path, model: str, version: int
) -> None:
    await register_adapter(harness, tmp_path, base_model=model, base_version=version)
    await harness.submit(harness.spec(from_adapter="bot@1"), msg_id="k", tenant="a")
    reason = await failed_reason(harness, "k", "a")
    assert f"trained on {model}@{version}" in reason
    assert "base model tiny@1" in reason


def test_from_adapter_must_name_a_version_or_an_alias() -> None:
    from pydantic import ValidationError

    from swarm_contracts.jobs import JobSpec

    base = {"name": "x", "base_model": "tiny", "dataset": "ds-" + "0" * 24}
    for good in ("bot@1", "bot@production"):
        assert JobSpec.model_validate(base | {"from_adapter": good}).from_adapter == good
    for bad in ("bot", "bot@", "@1", "Bot@1", "bot@1@2", "bot.x@1"):
        with pytest.raises(ValidationError, match="from_adapter"):
            JobSpec.model_validate(base | {"from_adapter": bad})

"""Continue training (``from_adapter``) through the real stack: v1, then v2 from v1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarm.errors import ValidationError
from swarm_contracts.jobs import JobState
from swarm_runtime.store import LocalStore

from .conftest import Stack

pytestmark = pytest.mark.slow


def spec(stack: Stack, **overrides: object) -> dict:
    return {
        "name": "e2e-continued",
        "base_model": "tiny-llama",
        "dataset": stack.train.id,
        "validation": stack.validation.id,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "max_steps": 10,
            "batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 1,
            "seq_len": 64,
            "eval_every": 10,
            "checkpoint_every": 10,
        },
    } | overrides


def lora_b(store: LocalStore, store_key: str, tmp: Path) -> dict[str, torch.Tensor]:
    store.get_file(f"{store_key}/adapter_model.safetensors", tmp / "w.safetensors")
    return {k: v for k, v in load_file(tmp / "w.safetensors").items() if "lora_B" in k}


def test_a_job_continues_from_a_registered_adapter(stack: Stack, tmp_path: Path) -> None:
    client = stack.client
    first = client.wait(client.submit(spec(stack), "e2e-continue-v1").job_id, timeout=300)
    assert first.state == JobState.succeeded, first.reason
    assert first.adapter is not None
    v1 = first.adapter.version

    # v2 asks for another LoRA shape: the parent's wins (a LoRA's shape cannot change).
    second_spec = spec(
        stack,
        from_adapter=f"e2e-continued@{v1}",
        lora={"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj"]},
        training=spec(stack)["training"] | {"max_steps": 2, "lr": 5e-4, "warmup_steps": 0},
    )
    submitted = client.submit(second_spec, "e2e-continue-v2")
    assert submitted.spec.lora.r == 4
    assert submitted.spec.lora.target_modules == ["q_proj", "v_proj"]
    second = client.wait(submitted.job_id, timeout=300)
    assert second.state == JobState.succeeded, second.reason
    assert second.adapter is not None
    assert second.adapter.version > v1

    v2 = client.get_adapter("e2e-continued", second.adapter.version)
    lineage = v2.lineage
    assert lineage.parent == f"e2e-continued@{v1}"
    assert lineage.lora.r == 4
    assert lineage.validation_digest == stack.validation.sha256
    assert lineage.worker_ids == ["e2e-worker"]

    # v2 started from v1's weights: two small steps moved them a little, nowhere near zero
    # (where a fresh LoRA B starts).
    store = LocalStore(stack.local.store_dir)
    b1 = lora_b(store, first.adapter.store_key, tmp_path)
    b2 = lora_b(store, v2.store_key, tmp_path)
    assert b1.keys() == b2.keys()
    assert b1
    for name in b1:
        moved = (b2[name] - b1[name]).norm()
        assert moved < 0.5 * b1[name].norm(), name

    graph = client.adapter_lineage("e2e-continued", v2.version)
    assert [a["ref"] for a in graph["adapters"]] == [
        f"e2e-continued@{v2.version}",
        f"e2e-continued@{v1}",
    ]
    assert {
        "source": f"e2e-continued@{v2.version}",
        "target": f"e2e-continued@{v1}",
        "kind": "parent",
    } in graph["edges"]


def test_the_gateway_refuses_a_parent_that_cannot_be_continued(stack: Stack) -> None:
    with pytest.raises(ValidationError, match="not found"):
        stack.client.submit(spec(stack, from_adapter="no-such-adapter@1"), "e2e-continue-bad")
    with pytest.raises(ValidationError, match="from_adapter"):
        stack.client.submit(spec(stack, from_adapter="no-version"), "e2e-continue-bad2")

"""Continuing training: the parent adapter is fetched, verified and loaded, trainable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from swarm_contracts.jobs import LoraSpec, ParentAdapter, TrainingSpec
from swarm_runtime.store import LocalStore
from swarm_trainer.checkpoint import save_adapter
from swarm_trainer.model import build_model
from swarm_trainer.parent_adapter import ParentAdapterError, fetch_parent, missing_parent_files

PARENT_LORA = LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])


def lora_b(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Names without the adapter name, so that a saved and a loaded adapter compare.
    state = get_peft_model_state_dict(model)  # type: ignore[arg-type]
    return {k: v.clone() for k, v in state.items() if "lora_B" in k}


@pytest.fixture
def parent(tiny_model_dir: Path, tmp_path: Path) -> tuple[LocalStore, ParentAdapter, dict]:
    """A trained-looking adapter in the store: LoRA B is non-zero (a fresh one's is zero)."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    config = LoraConfig(
        r=PARENT_LORA.r,
        lora_alpha=PARENT_LORA.alpha,
        target_modules=PARENT_LORA.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    save_adapter(model, tmp_path / "v1")  # type: ignore[arg-type]
    store = LocalStore(tmp_path / "store")
    key = "adapters/default/bot/1"
    files = store.upload_dir(tmp_path / "v1", key)
    return store, ParentAdapter(name="bot", version=1, store_key=key, files=files), lora_b(model)


def test_a_continued_job_starts_from_the_parent_s_weights_and_trains_them(
    tiny_model_dir: Path, tmp_path: Path, parent: tuple[LocalStore, ParentAdapter, dict]
) -> None:
    store, ref, parent_b = parent
    directory = fetch_parent(store, ref, tmp_path / "fetched")
    assert sorted(p.name for p in directory.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    # The job's spec carries the parent's shape (the scheduler copies it); dropout is its own.
    lora = PARENT_LORA.model_copy(update={"dropout": 0.1})
    model = build_model(tiny_model_dir, lora, TrainingSpec(), directory)

    loaded = lora_b(model)
    assert loaded.keys() == parent_b.keys()
    assert loaded
    for name, value in parent_b.items():
        assert torch.equal(loaded[name], value), name
    assert any(v.abs().sum() > 0 for v in loaded.values())  # not a fresh (zero) LoRA B
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in n for n in trainable)
    assert model.peft_config["default"].lora_dropout == 0.1
    assert model.peft_config["default"].r == PARENT_LORA.r

    # A fresh adapter, for contrast: LoRA B starts at zero.
    fresh = build_model(tiny_model_dir, PARENT_LORA, TrainingSpec())
    assert all(v.abs().sum() == 0 for v in lora_b(fresh).values())


def test_a_parent_that_does_not_match_its_recorded_digest_is_refused(
    tmp_path: Path, parent: tuple[LocalStore, ParentAdapter, dict]
) -> None:
    store, ref, _ = parent
    store.put_bytes(f"{ref.store_key}/adapter_model.safetensors", b"tampered")
    with pytest.raises(ParentAdapterError, match="sha256"):
        fetch_parent(store, ref, tmp_path / "fetched")


def test_missing_parent_files_are_named(parent: tuple[LocalStore, ParentAdapter, dict]) -> None:
    store, ref, _ = parent
    assert missing_parent_files(store, ref) == []
    store.delete(f"{ref.store_key}/adapter_config.json")
    assert missing_parent_files(store, ref) == ["adapter_config.json"]
    only_weights = ref.model_copy(update={"files": {"adapter_model.safetensors": "x"}})
    assert missing_parent_files(store, only_weights) == ["adapter_config.json"]

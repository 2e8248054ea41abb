"""A merged export behaves exactly like base + adapter, and loads without peft."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.layout import export_prefix
from swarm_runtime.store import LocalStore
from swarm_trainer.checkpoint import save_adapter
from swarm_trainer.export import export_merged
from swarm_trainer.model import build_model


def test_merged_model_logits_match_base_plus_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(tiny_model_dir, LoraSpec(target_modules="all-linear"), TrainingSpec())
    with torch.no_grad():  # a trained-looking adapter: LoRA B starts at zero, which is no test
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    save_adapter(model, tmp_path / "adapter")
    store = LocalStore(tmp_path / "store")
    store.upload_dir(tiny_model_dir, "models/tiny/1")
    store.upload_dir(tmp_path / "adapter", "adapters/default/arith/1")

    key = export_merged(
        store, "models/tiny/1", "adapters/default/arith/1", export_prefix("default", "arith", 1)
    )
    assert key == "exports/default/arith/1"
    names = {k.rsplit("/", 1)[-1] for k in store.list(key + "/")}
    assert "config.json" in names
    assert any(n.endswith(".safetensors") for n in names)
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    assert "adapter_config.json" not in names  # plain weights, no peft needed

    store.download_dir(key, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", use_safetensors=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    ids = torch.tensor([[1, 300, 301, 302, 303, 304]])
    with torch.no_grad():
        plain = base(ids).logits.clone()
        tuned = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()(ids).logits
        got = merged(ids).logits
    assert not torch.allclose(plain, tuned, atol=1e-3)  # the adapter does change the model
    assert torch.allclose(got, tuned, atol=1e-4)

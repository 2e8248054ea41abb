"""The addmm LoRA variant computes what peft's vanilla LoRA computes, and saves the same."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from swarm_trainer.fused_lora import AddmmLora, use_addmm_lora
from swarm_trainer.tiny_model import create_tiny_model


def lora_model(model_dir: Path) -> PeftModel:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    # B starts at zero; a random B makes the update (and any scaling mistake) visible.
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model


def test_outputs_gradients_saved_weights_and_merge_match_vanilla_lora(tmp_path: Path) -> None:
    model_dir = create_tiny_model(tmp_path / "tiny")
    vanilla = lora_model(model_dir)
    fused = copy.deepcopy(vanilla)
    changed = use_addmm_lora(fused)
    assert changed > 0
    assert not vanilla.base_model.model.model.layers[0].self_attn.q_proj.lora_variant
    assert isinstance(
        fused.base_model.model.model.layers[0].self_attn.q_proj.lora_variant["default"], AddmmLora
    )

    ids = torch.randint(3, 100, (2, 17))
    losses = []
    for model in (vanilla, fused):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    grads = [
        {n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in (vanilla, fused)
    ]
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)

    # What is saved is peft's own adapter, loadable by stock peft.
    vanilla.save_pretrained(tmp_path / "v")
    fused.save_pretrained(tmp_path / "f")
    configs = [json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in "vf"]
    for config in configs:  # "all-linear" resolves to a set: its order is not the point
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1]
    reference = vanilla.merge_and_unload()
    merged = fused.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(reference(ids).logits, merged(ids).logits)

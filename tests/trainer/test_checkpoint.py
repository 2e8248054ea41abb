"""Checkpoints hold adapter, optimizer and schedule in safetensors + JSON, and load back exactly."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from swarm_trainer.checkpoint import load_checkpoint, save_checkpoint
from swarm_trainer.recipe import lr_lambda


def setup(model_dir: Path, seed: int) -> tuple:
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(2, 10))
    return model, optimizer, scheduler


def step(model, optimizer, scheduler) -> float:  # type: ignore[no-untyped-def]
    ids = torch.arange(1, 9).unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(loss.detach())


def test_checkpoint_round_trip_continues_identically(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir, seed=0)
    for _ in range(3):
        step(model, optimizer, scheduler)
    save_checkpoint(tmp_path, model, optimizer, scheduler, {"step": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.safetensors",
        "optimizer_groups.json",
        "scheduler.json",
        "trainer_state.json",
    ]
    expected = [step(model, optimizer, scheduler) for _ in range(2)]

    # A fresh model with different LoRA init, restored from the checkpoint.
    model2, optimizer2, scheduler2 = setup(tiny_model_dir, seed=1)
    assert load_checkpoint(tmp_path, model2, optimizer2, scheduler2) == {"step": 3}
    resumed = [step(model2, optimizer2, scheduler2) for _ in range(2)]
    assert resumed == expected

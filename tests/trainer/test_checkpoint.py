"""Checkpoints hold adapter, optimizer and schedule in safetensors + JSON, and load back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from swarm_trainer.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from swarm_trainer.reports import Evaluation
from swarm_trainer.step import lr_lambda
from swarm_trainer.train_state import TrainState


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
    evaluation = Evaluation(step=2, eval_loss=1.5, perplexity=4.48)
    best = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    state = TrainState(
        step=3,
        data_index=6,
        train_loss=1.25,
        eval_history=[evaluation],
        best=evaluation,
        best_weights=best,
    )
    save_checkpoint(tmp_path, model, optimizer.state_dict(), scheduler, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "best_adapter.safetensors",
        "optimizer.safetensors",
        "optimizer_groups.json",
        "scheduler.json",
        "trainer_state.json",
    ]
    expected = [step(model, optimizer, scheduler) for _ in range(2)]

    # A fresh model with different LoRA init, restored from the checkpoint.
    model2, optimizer2, scheduler2 = setup(tiny_model_dir, seed=1)
    loaded = load_checkpoint(tmp_path, model2, optimizer2, scheduler2)
    assert loaded == state
    assert loaded.best_weights is not None
    assert loaded.best_weights.keys() == best.keys()
    assert all(torch.equal(loaded.best_weights[k], best[k]) for k in best)
    resumed = [step(model2, optimizer2, scheduler2) for _ in range(2)]
    assert resumed == expected


def test_train_state_reads_what_the_dict_based_loop_wrote() -> None:
    """Checkpoints written before ``TrainState`` existed hold this JSON: they still resume."""
    written = {
        "step": 10,
        "data_index": 20,
        "eval_history": [
            {"step": 5, "eval_loss": 2.5, "perplexity": 12.18},
            {"step": 10, "eval_loss": 2.75, "perplexity": 15.64},
        ],
        "train_loss": 2.0,
        "best": {"step": 5, "eval_loss": 2.5, "perplexity": 12.18},
    }
    state = TrainState.from_json(json.loads(json.dumps(written)))
    assert state.step == 10
    assert state.data_index == 20
    assert state.best == Evaluation(step=5, eval_loss=2.5, perplexity=12.18)
    assert [e.step for e in state.eval_history] == [5, 10]
    assert state.to_json() == written  # and it writes the same layout back
    assert TrainState.from_json({**written, "best": None, "eval_history": []}).best is None

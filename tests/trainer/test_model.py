"""The model a job trains: gradient checkpointing recomputes, trains, and changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer.data import Batch, collate
from swarm_trainer.methods.sft import tokenize
from swarm_trainer.model import build_model
from swarm_trainer.step import lr_lambda, train_step

RECORDS = [
    {"prompt": "Question: what is 3 plus 3? Answer:", "completion": " 6."},
    {"prompt": "Translate to French: cat ->", "completion": " chat, dog -> chien."},
    {"text": "The quick brown fox jumps over the lazy dog."},
]
STEPS = 4


@dataclass
class Run:
    losses: list[float]
    mlp_calls: int  # forward passes through the first decoder layer's MLP
    moved: dict[str, bool]  # each LoRA weight: changed by training


def train(model_dir: Path, batch: Batch, checkpointing: bool) -> Run:
    torch.manual_seed(0)
    training = TrainingSpec(gradient_checkpointing=checkpointing)
    model = build_model(model_dir, LoraSpec(dropout=0.1), training).train()
    calls = 0
    mlp = model.get_base_model().model.layers[0].mlp
    forward = mlp.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        # Wraps forward, not a forward hook: torch runs no module hooks when it recomputes.
        nonlocal calls
        calls += 1
        return forward(*args, **kwargs)

    mlp.forward = counted
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in lora.items()}
    # No weight decay: a LoRA weight moves only if a gradient reached it.
    opt = torch.optim.AdamW(lora.values(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, STEPS))
    torch.manual_seed(1)  # dropout masks
    cpu = torch.device("cpu")
    losses = [train_step(model, [batch], opt, sched, 1.0, cpu).loss for _ in range(STEPS)]
    moved = {n: not torch.equal(before[n], p.detach()) for n, p in lora.items()}
    return Run(losses, calls, moved)


def test_gradient_checkpointing_recomputes_and_trains_like_the_plain_model(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    batch = collate(tokenize(RECORDS * 2, tokenizer, 64), tokenizer.pad_token_id)
    plain = train(tiny_model_dir, batch, checkpointing=False)
    checkpointed = train(tiny_model_dir, batch, checkpointing=True)

    # It is on: each layer runs forward again in the backward pass.
    assert plain.mlp_calls == STEPS
    assert checkpointed.mlp_calls == 2 * STEPS
    # Gradients reach every LoRA weight (A and B, all layers) through the recomputed layers.
    assert checkpointed.moved
    assert all(checkpointed.moved.values()), [n for n, m in checkpointed.moved.items() if not m]
    assert checkpointed.losses[-1] < checkpointed.losses[0] - 0.1, checkpointed.losses
    # Recomputing (with the same dropout masks) is the same training.
    assert torch.allclose(torch.tensor(checkpointed.losses), torch.tensor(plain.losses), atol=1e-5)

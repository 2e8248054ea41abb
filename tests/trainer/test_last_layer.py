"""The last layer's MLP only at predicted positions: the same loss and gradients as the whole
layer, and the whole layer wherever no rows are given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer import last_layer
from swarm_trainer.data import collate_packed
from swarm_trainer.methods.sft import causal_lm_loss, tokenize
from swarm_trainer.model import build_model

RECORDS = [
    {"prompt": "Question: what is 3 plus 3? Answer:", "completion": " 6."},
    {"prompt": "Translate to French: cat ->", "completion": " chat, dog -> chien."},
    {"prompt": "Name a colour:", "completion": " blue"},
]


def lora_model(model_dir: Path, install: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        if not install:
            m.setattr(last_layer, "install", lambda model: False)
        torch.manual_seed(0)
        model = build_model(
            model_dir, LoraSpec(dropout=0.0, target_modules="all-linear"), TrainingSpec()
        )
    # B starts at zero; a random B puts the last layer's LoRA into the loss and its gradients.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return model.train()


def test_loss_and_gradients_equal_the_whole_layer(
    tiny_model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = lora_model(tiny_model_dir, False, monkeypatch)
    pruned = lora_model(tiny_model_dir, True, monkeypatch)
    assert last_layer.installed(whole) is None
    layer = last_layer.installed(pruned)
    assert layer is pruned.base_model.model.model.layers[-1]

    batch = collate_packed(tokenize(RECORDS, tokenizer, 64), tokenizer.pad_token_id, 64)
    assert batch.predicting is not None
    # Most of the row is prompt: the pruned layer really drops rows.
    assert 0 < len(batch.predicting) < batch.inputs["input_ids"].shape[1] // 2
    seen: list[torch.Size] = []
    layer.mlp.register_forward_hook(lambda module, args, out: seen.append(out.shape))

    losses = [causal_lm_loss(m, batch, batch.targets) for m in (whole, pruned)]
    assert seen == [torch.Size([1, len(batch.predicting), whole.config.hidden_size])]
    torch.testing.assert_close(losses[0], losses[1])
    for loss in losses:
        loss.backward()
    grads = [
        {n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in (whole, pruned)
    ]
    last_mlp = [n for n in grads[0] if ".layers.1.mlp." in n and "lora_B" in n]
    assert last_mlp
    assert all(grads[0][n].abs().sum() > 0 for n in last_mlp)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)
    assert layer.swarm_rows is None  # only for that forward


def test_without_rows_the_layer_computes_every_position(
    tiny_model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = lora_model(tiny_model_dir, False, monkeypatch).eval()
    pruned = lora_model(tiny_model_dir, True, monkeypatch).eval()
    batch = collate_packed(tokenize(RECORDS, tokenizer, 64), tokenizer.pad_token_id, 64)
    with torch.no_grad():
        a, b = (m(**batch.inputs, use_cache=False) for m in (whole, pruned))
    assert a.logits.shape == b.logits.shape
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.loss, b.loss)


def test_not_installed_with_gradient_checkpointing(tiny_model_dir: Path) -> None:
    # Its recomputation in the backward would run the layer without the rows.
    model = build_model(tiny_model_dir, LoraSpec(), TrainingSpec(gradient_checkpointing=True))
    assert last_layer.installed(model) is None

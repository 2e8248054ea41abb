"""Packed rows: several examples per row, and not one of them attends to another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer.data import IGNORE_INDEX, collate, collate_packed, pack_rows
from swarm_trainer.methods.sft import tokenize
from swarm_trainer.model import build_model
from swarm_trainer.step import lr_lambda, train_step

RECORDS = [
    {"prompt": "Question: what is 3 plus 3? Answer:", "completion": " 6."},
    {"prompt": "Translate to French: cat ->", "completion": " chat, dog -> chien."},
    {"text": "The quick brown fox jumps over the lazy dog."},
]


def test_packed_logits_equal_each_example_alone(tiny_model_dir: Path, tokenizer: Any) -> None:
    model = build_model(tiny_model_dir, LoraSpec(dropout=0.0), TrainingSpec()).eval()
    examples = tokenize(RECORDS, tokenizer, 64)
    batch = collate_packed(examples, tokenizer.pad_token_id, capacity=64)
    assert batch.inputs["input_ids"].shape[0] == 1  # all three share one row
    assert "attention_mask" not in batch.inputs
    assert batch.tokens == sum(len(e.input_ids) for e in examples)
    with torch.no_grad():
        packed = model(**batch.inputs, use_cache=False).logits[0]
        at = 0
        for source in batch.sources:  # the row's order (longest first)
            ids = torch.tensor([examples[source].input_ids])
            alone = model(input_ids=ids).logits[0]
            assert torch.allclose(packed[at : at + ids.shape[1]], alone, atol=1e-5), source
            at += ids.shape[1]
        # Without the restarted positions the same row does mix examples: the check can fail.
        mixed = model(input_ids=batch.inputs["input_ids"], use_cache=False).logits[0]
        last = examples[batch.sources[-1]]
        n = len(last.input_ids)
        assert not torch.allclose(mixed[at - n : at], packed[at - n : at], atol=1e-3)


def test_packed_and_padded_batches_give_the_same_loss(tiny_model_dir: Path, tokenizer: Any) -> None:
    model = build_model(tiny_model_dir, LoraSpec(dropout=0.0), TrainingSpec()).eval()
    # One long example among short ones: padding every row to it wastes most of the batch.
    long = {"text": "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20."}
    examples = tokenize([*RECORDS * 3, long], tokenizer, 64)
    packed = collate_packed(examples, tokenizer.pad_token_id, capacity=64)
    padded = collate(examples, tokenizer.pad_token_id)
    # Fewer rows, fewer padded positions, same real tokens and targets.
    assert packed.inputs["input_ids"].numel() < padded.inputs["input_ids"].numel()
    assert packed.tokens == padded.tokens
    targets = (packed.inputs["labels"] != IGNORE_INDEX).sum()
    assert targets == (padded.inputs["labels"][:, 1:] != IGNORE_INDEX).sum()
    with torch.no_grad():
        loss_packed = model(**packed.inputs, use_cache=False).loss
        assert torch.allclose(loss_packed, model(**padded.inputs, use_cache=False).loss, atol=1e-5)


def test_pack_rows_respects_capacity() -> None:
    from swarm_trainer.data import Example

    examples = [Example([1] * n, [1] * n, i) for i, n in enumerate([6, 5, 4, 3, 3, 2, 1])]
    rows = pack_rows(examples, capacity=8)
    assert all(sum(len(e.input_ids) for e in row) <= 8 for row in rows)
    assert sorted(e.source for row in rows for e in row) == list(range(7))
    assert len(rows) == 3  # 24 tokens in rows of 8: first-fit decreasing fills them exactly


def test_the_seed_fixes_the_training(tiny_model_dir: Path, tokenizer: Any) -> None:
    examples = tokenize(RECORDS * 2, tokenizer, 64)
    batch = collate(examples, tokenizer.pad_token_id)

    def losses(seed: int) -> list[float]:
        torch.manual_seed(seed)
        model = build_model(tiny_model_dir, LoraSpec(dropout=0.1), TrainingSpec()).train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, 4))
        device = torch.device("cpu")
        torch.manual_seed(seed + 1)  # dropout masks
        return [train_step(model, [batch], opt, sched, 1.0, device).loss for _ in range(3)]

    plain = losses(0)
    assert losses(0) == plain  # same seed: same losses, exactly
    assert losses(5) != plain  # another seed: other LoRA init and dropout masks

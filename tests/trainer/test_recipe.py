"""The recipe's training step: gradient accumulation on chat data is one bigger batch."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer.data import IGNORE_INDEX, collate
from swarm_trainer.methods.sft import tokenize
from swarm_trainer.model import build_model
from swarm_trainer.step import train_step


def _chat(question: str, answer: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }


# Completions of very different lengths: a mean of per-micro-batch means would weigh the
# tokens of the short ones more than those of the long ones.
CHATS = [
    _chat("2+2?", "4"),
    _chat("Name a colour.", "Blue"),
    _chat("Count to twenty.", " ".join(str(i) for i in range(1, 21))),
    _chat("Spell cat.", "c a t, and backwards t a c, and once more c a t"),
]


def _sgd_step(model: Any, batches: list[Any]) -> tuple[float, dict[str, torch.Tensor]]:
    """One step with plain SGD at lr 1 and no clipping: the weight change is -gradient."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.SGD(params.values(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    out = train_step(model, batches, opt, sched, 1e9, torch.device("cpu"))
    return out.loss, {n: before[n] - p.detach() for n, p in params.items()}


def test_accumulated_chat_micro_batches_equal_one_large_batch(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    examples = tokenize(CHATS, tokenizer, 128)
    assert len(examples) == len(CHATS)
    pad = tokenizer.pad_token_id
    halves = [collate(examples[:2], pad), collate(examples[2:], pad)]
    whole = collate(examples, pad)
    # The data does tell the two normalisations apart (else the test could not fail).
    assert halves[0].targets * 3 < halves[1].targets

    model = build_model(tiny_model_dir, LoraSpec(dropout=0.0), TrainingSpec()).train()
    twin = copy.deepcopy(model)
    expected_loss = _token_mean_loss(copy.deepcopy(model), examples)
    accumulated_loss, accumulated = _sgd_step(model, halves)
    single_loss, single = _sgd_step(twin, [whole])

    # The loss is the mean over every target token of the step, in both layouts.
    assert abs(accumulated_loss - expected_loss) < 1e-5
    assert abs(single_loss - expected_loss) < 1e-5
    assert accumulated.keys() == single.keys()
    moved = 0
    for name, delta in single.items():
        assert torch.allclose(accumulated[name], delta, atol=1e-6, rtol=1e-4), name
        moved += int(delta.abs().sum() > 0)
    assert moved > 0  # LoRA B gets a gradient on the first step (A does once B is non-zero)


@torch.no_grad()
def _token_mean_loss(model: Any, examples: list[Any]) -> float:
    """Sum of every target token's cross-entropy over the number of targets, one by one."""
    total, count = 0.0, 0
    for e in examples:
        logits = model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
        labels = torch.tensor(e.labels[1:])
        keep = labels != IGNORE_INDEX
        loss = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
        total += float(loss)
        count += int(keep.sum())
    return total / count

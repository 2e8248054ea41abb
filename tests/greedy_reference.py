"""transformers' own greedy ``generate``, the reference that Swarm's batched generation
(``swarm_generation``) must match token for token."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch


@torch.no_grad()
def transformers_greedy(
    model: Any, prompts: list[list[int]], max_new_tokens: int, pad: int, eos: Collection[int]
) -> list[list[int]]:
    """Greedy ``generate`` over one left-padded batch: each row's new tokens up to and
    including its first end-of-sequence one."""
    width = max(len(p) for p in prompts)
    out = model.generate(
        input_ids=torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
        attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=list(eos),
    )
    rows = []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows

"""Choosing each row's next token: greedy at temperature 0, else temperature, top-k and
nucleus (top_p), and the chosen token's log-probability under the distribution it was drawn
from, for the rows that asked (the Tinker API's sampling: an RL loop compares it with the
trainer's).

A row may come with the token ids it is allowed (constrained decoding: the inference engine's
``json_format``): its other logits are masked before it is chosen, greedy or sampled; other
rows are untouched.

Sampled rows draw from their own seeded ``torch.Generator`` on the CPU, so a request with a
seed gives the same tokens whatever else shares its batch, and on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = -1
    # Token ids that end the completion in place of the model's end-of-sequence ones (None:
    # those); () ends it only at max_tokens.
    stop_tokens: tuple[int, ...] | None = None
    logprobs: bool = False
    # Each prompt token's log-probability too (a prefill that keeps every position's logits).
    prompt_logprobs: bool = False
    # Generate max_tokens whatever the model says (benchmarks: equal work on every side).
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k must be -1 (no limit) or at least 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def generator_for(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator()
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of ``probs`` (1-D) outside the smallest set whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the tokens ahead
    sorted_probs[before >= top_p] = 0.0  # the first token always stays (before == 0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def mask_disallowed(logits: torch.Tensor, allowed: list[list[int] | None]) -> torch.Tensor:
    """``logits`` with -inf everywhere but the allowed ids of the rows that have a list
    (a copy when any row has one)."""
    constrained = [i for i, ids in enumerate(allowed) if ids is not None]
    if not constrained:
        return logits
    masked = logits.clone()
    for i in constrained:
        ids = torch.tensor(allowed[i], dtype=torch.long, device=logits.device)
        row = torch.full_like(masked[i], float("-inf"))
        row[ids] = masked[i, ids]
        masked[i] = row
    return masked


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``logits`` (1-D) with -inf outside the ``k`` largest (-1: all kept)."""
    if k < 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def next_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    allowed: list[list[int] | None] | None = None,
) -> tuple[list[int], list[float | None]]:
    """One token per row of ``logits`` ([rows, vocab]), and its log-probability for the rows
    whose params ask (else None): under the temperature-scaled distribution it was drawn from,
    before top-k and top-p cut its tail (the full softmax at temperature 1, as a trainer's
    forward computes it, when greedy). ``allowed``: per row, None or the only token ids it
    may take."""
    if allowed is not None:
        logits = mask_disallowed(logits, allowed)
    chosen = logits.argmax(dim=-1).tolist()
    logprobs: list[float | None] = [None] * len(params)
    for i, p in enumerate(params):
        if p.greedy and p.logprobs:
            logprobs[i] = float(torch.log_softmax(logits[i].float(), dim=-1)[chosen[i]])
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = logits[sampled].float().cpu()
        for row, i in zip(rows, sampled, strict=True):
            scaled = row / params[i].temperature
            probs = torch.softmax(top_k(scaled, params[i].top_k), dim=-1)
            probs = nucleus(probs, params[i].top_p)
            chosen[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
            if params[i].logprobs:
                logprobs[i] = float(torch.log_softmax(scaled, dim=-1)[chosen[i]])
    return chosen, logprobs

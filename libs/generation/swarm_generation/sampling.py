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
from math import inf

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
    # The k most likely tokens and their log-probabilities at each generated position (0: none).
    top_logprobs: int = 0
    # Each prompt token's log-probability too (a prefill that keeps every position's logits).
    prompt_logprobs: bool = False
    # The k most likely tokens at each prompt position after the first (0: none).
    prompt_top_logprobs: int = 0
    # Token ids to score at each prompt position after the first: one row per position, all
    # rows as wide, -1 in a cell that asks for nothing (the Tinker API's target logprobs).
    prompt_targets: tuple[tuple[int, ...], ...] | None = None
    # Draws (with replacement, at this temperature) from the model's distribution at each
    # prompt position after the first (the Tinker API's prompt_alt_tokens_k; 0: none).
    prompt_alt_tokens: int = 0
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
        if self.top_logprobs < 0 or self.prompt_top_logprobs < 0 or self.prompt_alt_tokens < 0:
            raise ValueError("top_logprobs, prompt_top_logprobs, prompt_alt_tokens must be >= 0")
        if self.prompt_targets is not None and len({len(r) for r in self.prompt_targets}) > 1:
            raise ValueError("prompt_targets: every row must be as wide")

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


def alternatives_generator(params: SamplingParams) -> torch.Generator | None:
    """The generator of a row's prompt alternatives: its own, so that asking for them leaves
    the row's sampled tokens as they are; seeded from the row's seed (mixed, so that it is no
    other row's sampling stream: the Tinker API seeds sample ``i`` with ``seed + i``)."""
    if params.greedy or params.prompt_alt_tokens == 0:
        return None
    generator = torch.Generator()
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed((params.seed * 0x9E3779B97F4A7C15 + 1) % 2**64)
    return generator


def draw_alternatives(
    logits: torch.Tensor,
    logprobs: torch.Tensor,
    k: int,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` independent draws with replacement at every row of ``logits`` ([positions,
    vocab]) at ``temperature`` (0: the best token, k times), and their log-probabilities
    under ``logprobs`` (the model's own, [positions, vocab]): ([positions, k] ids, the same
    shape of log-probabilities). One inverse-CDF search on the device for every position at
    once; the uniforms come from ``generator`` on the CPU, so that a seed draws the same on
    any device (up to the rounding of the cumulative sums)."""
    n = logits.shape[0]
    if temperature == 0:
        ids = logits.argmax(dim=-1, keepdim=True).expand(n, k)
    else:
        cdf = torch.softmax(logits.float() / temperature, dim=-1).cumsum_(dim=-1)
        uniforms = torch.rand((n, k), generator=generator).to(logits.device)
        # Scaled by each row's total: a sum that rounds below 1 never runs past the vocabulary,
        # and right=True skips tokens of no probability (their sum equals the one before).
        ids = torch.searchsorted(cdf, uniforms * cdf[:, -1:], right=True)
        ids = ids.clamp_(max=logits.shape[-1] - 1)
    return ids, logprobs.gather(1, ids)


def target_logprobs(logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row of ``logprobs`` ([positions, vocab]) at the ids of the same row of
    ``targets`` ([positions, width], -1: none), 0.0 where a cell asks for none: one gather."""
    asked = targets >= 0
    values = logprobs.gather(1, targets.clamp(min=0))
    return values.masked_fill_(~asked, 0.0)


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


# A token's alternatives: (token id, log-probability), most likely first.
Alternatives = list[tuple[int, float]]


def top_alternatives(
    logits: torch.Tensor, params: list[SamplingParams]
) -> list[Alternatives | None]:
    """Each asking row's ``top_logprobs`` most likely tokens under the distribution its token
    is drawn from (temperature-scaled; greedy: temperature 1), else None. One ``log_softmax``
    and ``topk`` on the device for the asking rows together; ids a constraint masked out
    (-inf) are left out, so a row may get fewer than it asked."""
    out: list[Alternatives | None] = [None] * len(params)
    asking = [i for i, p in enumerate(params) if p.top_logprobs > 0]
    if not asking:
        return out
    k = min(max(params[i].top_logprobs for i in asking), logits.shape[-1])
    rows = logits[torch.tensor(asking, device=logits.device)].float()
    temperatures = [1.0 if params[i].greedy else params[i].temperature for i in asking]
    if any(t != 1.0 for t in temperatures):
        rows = rows / torch.tensor(temperatures, device=rows.device)[:, None]
    values, ids = torch.topk(torch.log_softmax(rows, dim=-1), k, dim=-1)
    for i, row_ids, row_values in zip(
        asking, ids.cpu().tolist(), values.cpu().tolist(), strict=True
    ):
        n = params[i].top_logprobs
        out[i] = [(t, v) for t, v in zip(row_ids[:n], row_values[:n], strict=True) if v > -inf]
    return out


def next_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    allowed: list[list[int] | None] | None = None,
) -> tuple[list[int], list[float | None], list[Alternatives | None]]:
    """One token per row of ``logits`` ([rows, vocab]), and its log-probability for the rows
    whose params ask (else None): under the temperature-scaled distribution it was drawn from,
    before top-k and top-p cut its tail (the full softmax at temperature 1, as a trainer's
    forward computes it, when greedy); and the asking rows' ``top_alternatives`` under that
    same distribution. ``allowed``: per row, None or the only token ids it may take."""
    if allowed is not None:
        logits = mask_disallowed(logits, allowed)
    alternatives = top_alternatives(logits, params)
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
    return chosen, logprobs, alternatives

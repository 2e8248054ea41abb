"""``generate``, the running batch the inference engine and the trainer's task evals share,
against transformers' ``generate`` with greedy decoding: the same tokens, on a tiny random
Llama, whether rows share a batch, join it as others leave, or end at an end-of-sequence
token; and on a sliding-window model, whose batch cannot be spliced, as a static batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from swarm_generation.batch import Completion, Row, RunningBatch, generate
from swarm_generation.sampling import SamplingParams
from swarm_trainer.tiny_model import tiny_config

from ..greedy_reference import transformers_greedy

CPU = torch.device("cpu")
PROMPTS = [
    "The quick brown fox",
    "Question: What is two plus two? Answer:",
    "a",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
    "user: hello there assistant:",
    "Translate to French: cat -> chat, dog ->",
    "Checkpoints are saved",
]
MAX_NEW = 12
# What the sliding-window model takes of the tiny Llama's configuration.
SHARED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)


def encoded(tokenizer: Any) -> list[list[int]]:
    bos = [tokenizer.bos_token_id]
    return [bos + tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def reference(model: Any, prompts: list[list[int]], pad: int, eos: list[int]) -> list[list[int]]:
    return transformers_greedy(model, prompts, MAX_NEW, pad, eos)


def greedy(model: Any, tokenizer: Any, max_batch_size: int) -> list[Completion]:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    return generate(model, tokenizer, encoded(tokenizer), params, CPU, max_batch_size)


@pytest.mark.parametrize("max_batch_size", [32, 3, 1])
def test_greedy_tokens_are_transformers_greedy_ones(
    tiny: tuple[Any, Any], max_batch_size: int
) -> None:
    model, tokenizer = tiny
    expected = reference(
        model, encoded(tokenizer), tokenizer.pad_token_id, [tokenizer.eos_token_id]
    )
    got = greedy(model, tokenizer, max_batch_size)
    assert [list(c.tokens) for c in got] == expected
    assert {c.finish_reason for c in got} == {"length"}
    for completion in got:
        assert completion.text == tokenizer.decode(completion.tokens, skip_special_tokens=True)


@pytest.fixture
def early_eos(tiny: tuple[Any, Any]) -> Iterator[int]:
    """A token the model writes early in some rows and not in others, made an end of
    sequence in its generation config (the ids of which count as much as the tokenizer's)."""
    model, tokenizer = tiny
    tokens = reference(model, encoded(tokenizer), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    counts: dict[int, int] = {}
    for row in tokens:
        for token in set(row[1:4]):
            counts[token] = counts.get(token, 0) + 1
    eos = min(counts, key=lambda t: (abs(counts[t] - len(tokens) / 2), t))
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, eos]
    try:
        yield eos
    finally:
        model.generation_config.eos_token_id = saved


@pytest.mark.parametrize("max_batch_size", [32, 2])
def test_rows_end_at_an_end_of_sequence_token_as_in_transformers(
    tiny: tuple[Any, Any], early_eos: int, max_batch_size: int
) -> None:
    model, tokenizer = tiny
    eos = [tokenizer.eos_token_id, early_eos]
    expected = reference(model, encoded(tokenizer), tokenizer.pad_token_id, eos)
    got = greedy(model, tokenizer, max_batch_size)
    assert [list(c.tokens) for c in got] == expected
    reasons = [c.finish_reason for c in got]
    assert "stop" in reasons
    assert "length" in reasons
    for completion in got:
        assert (completion.finish_reason == "stop") == (completion.tokens[-1] in eos)


def test_a_sliding_window_model_runs_as_a_static_batch(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    torch.manual_seed(0)
    tiny_llama = tiny_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = MistralConfig(**{k: getattr(tiny_llama, k) for k in SHARED}, sliding_window=6)
    model = MistralForCausalLM(config).eval()
    expected = reference(
        model, encoded(tokenizer), tokenizer.pad_token_id, [tokenizer.eos_token_id]
    )
    assert [list(c.tokens) for c in greedy(model, tokenizer, 3)] == expected


def test_seeded_sampling_gives_the_same_completions_at_any_batch_size(
    tiny: tuple[Any, Any],
) -> None:
    model, tokenizer = tiny
    params = SamplingParams(max_tokens=MAX_NEW, temperature=1.0, seed=3)
    runs = [generate(model, tokenizer, encoded(tokenizer), params, CPU, size) for size in (32, 2)]
    assert [c.tokens for c in runs[0]] == [c.tokens for c in runs[1]]


def test_nothing_to_complete_is_no_completion(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    assert generate(model, tokenizer, [], SamplingParams(temperature=0.0), CPU) == []


def test_prompt_targets_and_alternatives_match_the_models_forward(tiny: tuple[Any, Any]) -> None:
    """From a padded prefill shared by prompts of other lengths: the named ids' log-probabilities
    at each prompt position (0.0 where a cell names none) and draws whose log-probabilities are
    the model's own there; a seeded row draws the same in any batch and samples the same
    tokens as without them."""
    model, tokenizer = tiny
    prompts = encoded(tokenizer)[:3]
    long = prompts[1]
    n = len(long)
    targets = tuple((long[p + 1], -1 if p % 2 else 7, 3) for p in range(n - 1))
    asked = SamplingParams(
        max_tokens=4, temperature=1.0, seed=11, prompt_targets=targets, prompt_alt_tokens=5
    )
    plain = SamplingParams(max_tokens=4, temperature=1.0, seed=11)

    def run(params: list[SamplingParams], ids: list[list[int]]) -> list[Row]:
        batch: RunningBatch[Row] = RunningBatch(model, tokenizer, CPU)
        rows = [Row.new(tokenizer, p, q) for p, q in zip(ids, params, strict=True)]
        with torch.no_grad():
            batch.prefill(rows)
            while batch.rows:
                batch.decode()
                batch.retire()
        return rows

    crowd = run([plain, asked, plain], prompts)
    row = crowd[1]
    with torch.no_grad():
        every = model(torch.tensor([long])).logits[0, :-1].float().log_softmax(-1)
    assert row.prompt_target_logprobs is not None
    got = torch.tensor(row.prompt_target_logprobs)
    assert got.shape == (n - 1, 3)
    expected = every.gather(1, torch.tensor(targets).clamp(min=0))
    expected[1::2, 1] = 0.0  # the -1 cells
    assert torch.allclose(got, expected, atol=1e-4)
    assert row.prompt_alt_tokens is not None
    assert len(row.prompt_alt_tokens) == n - 1
    for position, draws in enumerate(row.prompt_alt_tokens):
        assert len(draws) == 5
        for token, logprob in draws:
            assert logprob == pytest.approx(float(every[position, token]), abs=1e-4)
    assert crowd[0].prompt_alt_tokens is None
    assert crowd[0].prompt_target_logprobs is None
    alone = run([asked], [long])[0]
    assert alone.prompt_alt_tokens is not None
    assert [[t for t, _ in d] for d in alone.prompt_alt_tokens] == [
        [t for t, _ in d] for d in row.prompt_alt_tokens
    ]
    assert alone.tokens == run([plain], [long])[0].tokens  # its sampling stream is untouched
    # Greedy: the best token, k times.
    greedy_row = run([SamplingParams(max_tokens=1, temperature=0, prompt_alt_tokens=2)], [long])[0]
    assert greedy_row.prompt_alt_tokens is not None
    best = every.argmax(-1).tolist()
    assert [[t for t, _ in d] for d in greedy_row.prompt_alt_tokens] == [[b, b] for b in best]

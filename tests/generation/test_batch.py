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

from swarm_generation.batch import Completion, generate
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

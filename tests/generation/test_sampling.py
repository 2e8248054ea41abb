"""Each row's next token: greedy or sampled, seeded, and within the ids a row is allowed."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_generation.sampling import (
    SamplingParams,
    alternatives_generator,
    draw_alternatives,
    generator_for,
    next_tokens,
    nucleus,
    target_logprobs,
    top_k,
)


def test_a_row_with_allowed_ids_takes_one_of_them_and_the_others_are_untouched() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [0.0, 5.0, 1.0, 2.0]])
    greedy = SamplingParams(temperature=0)
    assert next_tokens(logits, [greedy, greedy], [None, None], [[2, 3], None])[0] == [3, 1]
    sampled = SamplingParams(temperature=2.0, seed=0)
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        [token], _, _ = next_tokens(logits[:1], [sampled], [generator], [[0, 2]])
        assert token in (0, 2)


def test_greedy_rows_take_the_argmax_and_their_logprob_when_asked() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    asked = SamplingParams(temperature=0, logprobs=True)
    tokens, logprobs, tops = next_tokens(
        logits, [asked, SamplingParams(temperature=0)], [None, None]
    )
    assert tokens == [1, 0]
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
    assert logprobs[1] is None
    assert tops == [None, None]  # nobody asked for alternatives


def test_alternatives_are_the_k_likeliest_under_the_drawing_distribution() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [2.0, 0.0, 1.0, -1.0], [0.0, 5.0, 1.0, 2.0]])
    greedy = SamplingParams(temperature=0, logprobs=True, top_logprobs=3)
    hot = SamplingParams(temperature=2.0, seed=0, logprobs=True, top_logprobs=2)
    constrained = SamplingParams(temperature=0, logprobs=True, top_logprobs=3)
    params = [greedy, hot, constrained]
    generators = [generator_for(p) for p in params]
    tokens, logprobs, tops = next_tokens(logits, params, generators, [None, None, [0, 2]])
    # Greedy: the best alternative is the token taken, with the token's own logprob.
    assert tops[0] is not None
    assert [t for t, _ in tops[0]] == [1, 3, 2]
    assert tops[0][0] == (tokens[0], pytest.approx(logprobs[0]))
    # Sampled: under the temperature-scaled softmax the token was drawn from.
    scaled = torch.log_softmax(logits[1] / 2.0, -1)
    assert tops[1] == [(0, pytest.approx(float(scaled[0]))), (2, pytest.approx(float(scaled[2])))]
    assert logprobs[1] == pytest.approx(float(scaled[tokens[1]]))
    # Constrained: the masked tokens are no alternatives (fewer than asked).
    assert tops[2] is not None
    assert [t for t, _ in tops[2]] == [2, 0]
    assert tops[2][0] == (tokens[2], pytest.approx(logprobs[2]))
    for top in tops:
        assert top is not None
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6


def test_a_seeded_row_draws_the_same_tokens_and_top_k_and_top_p_cut_the_tail() -> None:
    logits = torch.tensor([[1.0, 1.1, 0.9, -5.0]])
    params = SamplingParams(temperature=1.0, seed=7, top_k=3)
    draws = [
        [next_tokens(logits, [params], [generator])[0][0] for _ in range(20)]
        for generator in (generator_for(params), generator_for(params))
    ]
    assert draws[0] == draws[1]
    assert 3 not in draws[0]
    assert top_k(logits[0], 1).isinf().sum() == 3
    assert nucleus(torch.tensor([0.6, 0.3, 0.1]), 0.5).tolist() == pytest.approx([0.6, 0.0, 0.0])


@pytest.mark.parametrize(
    "bad", [{"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": 0}]
)
def test_settings_out_of_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_alternatives_are_draws_at_the_temperature_with_the_models_own_logprobs() -> None:
    """Many draws at one position follow softmax(logits / T); a token of no probability is
    never drawn; each draw's log-probability is the model's own (T = 1) at that id."""
    logits = torch.tensor([[2.0, 0.0, 1.0, -math.inf], [0.0, 0.0, 3.0, -math.inf]])
    own = torch.log_softmax(logits, dim=-1)
    generator = torch.Generator().manual_seed(0)
    ids, logprobs = draw_alternatives(logits, own, 20_000, 0.5, generator)
    assert ids.shape == logprobs.shape == (2, 20_000)
    assert not (ids == 3).any()
    for row in range(2):
        counts = torch.bincount(ids[row], minlength=4).float() / ids.shape[1]
        assert torch.allclose(counts, torch.softmax(logits[row] / 0.5, -1), atol=0.015)
    assert torch.equal(logprobs, own.gather(1, ids))
    # The same seed, the same draws; greedy: the best token k times.
    again = draw_alternatives(logits, own, 20_000, 0.5, torch.Generator().manual_seed(0))[0]
    assert torch.equal(again, ids)
    best, best_logprobs = draw_alternatives(logits, own, 3, 0.0, None)
    assert best.tolist() == [[0, 0, 0], [2, 2, 2]]
    assert torch.equal(best_logprobs, own.gather(1, best))


def test_target_logprobs_gather_each_rows_ids_and_zero_where_none_is_asked() -> None:
    logprobs = torch.log_softmax(torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), dim=-1)
    targets = torch.tensor([[2, -1], [-1, 0]])
    values = target_logprobs(logprobs, targets)
    assert values.tolist() == [
        [pytest.approx(float(logprobs[0, 2])), 0.0],
        [0.0, pytest.approx(float(logprobs[1, 0]))],
    ]


def test_alternatives_have_a_stream_of_their_own() -> None:
    """Asking for prompt alternatives leaves a seeded row's sampling stream alone."""
    params = SamplingParams(seed=4, prompt_alt_tokens=2)
    assert alternatives_generator(SamplingParams(seed=4)) is None
    assert alternatives_generator(SamplingParams(temperature=0, prompt_alt_tokens=2)) is None
    mine = alternatives_generator(params)
    rows = generator_for(params)
    assert mine is not None
    assert rows is not None
    assert not torch.equal(torch.rand(8, generator=mine), torch.rand(8, generator=rows))
    with pytest.raises(ValueError, match="as wide"):
        SamplingParams(prompt_targets=((1, 2), (3,)))

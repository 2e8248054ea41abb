"""The batching engine against peft and transformers' own generate, on the tiny model."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from swarm_generation.sampling import SamplingParams
from swarm_inference.adapter_cache import AdapterCache
from swarm_inference.adapter_files import AdapterError, AdapterSource, digests_of, read_adapter
from swarm_inference.base_model import load_base_model
from swarm_inference.engine import (
    AdapterUnavailable,
    ContextLengthExceeded,
    Engine,
    Piece,
)
from swarm_inference.lora_slots import LoraSlots

PROMPTS = [
    "The quick brown",
    "Question: What is two plus two? Answer:",
    "Swarm",
    "Workers send heartbeats; the",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0)


def reference(base_dir: Path, adapter_dir: Path | None, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' generate on the adapter merged into the base model (peft's merge)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, use_safetensors=True)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


async def collect(
    engine: Engine, ids: list[int], params: SamplingParams, adapter: Any = None
) -> list[Piece]:
    return [piece async for piece in engine.generate(ids, params, adapter)]


async def test_a_mixed_batch_matches_each_adapters_merged_model(
    engine: Engine, tiny_model_dir: Path, adapter_dirs: dict[str, Path], sources: dict
) -> None:
    tokenizer = engine.tokenizer
    jobs = [(name, prompt) for name in (None, *sources) for prompt in PROMPTS]
    steps = engine.steps
    results = await asyncio.gather(
        *(engine.complete(engine.encode(p), GREEDY, sources[n] if n else None) for n, p in jobs)
    )
    # 16 requests, 8 rows at most: two waves of 24 tokens, not 16 one-by-one generations.
    assert engine.steps - steps <= 2 * GREEDY.max_tokens
    by_adapter: dict[str | None, list[str]] = {}
    for (name, prompt), result in zip(jobs, results, strict=True):
        want = reference(
            tiny_model_dir, adapter_dirs[name] if name else None, engine.encode(prompt), 24
        )
        eos = tokenizer.eos_token_id
        expected = tokenizer.decode([t for t in want if t != eos], skip_special_tokens=True)
        assert result.text == expected, (name, prompt)
        assert result.finish_reason == ("stop" if eos in want else "length")
        assert result.completion_tokens == len(want)
        assert result.prompt_tokens == len(engine.encode(prompt))
        by_adapter.setdefault(name, []).append(result.text)
    # The adapters really change the answers: otherwise the comparison above proves nothing.
    answers = list(by_adapter.values())
    assert all(a != b for i, a in enumerate(answers) for b in answers[i + 1 :])


async def test_a_request_joins_the_running_batch_between_steps(
    engine: Engine, sources: dict
) -> None:
    long_ids, short_ids = engine.encode(PROMPTS[0]), engine.encode(PROMPTS[2])
    long_params = SamplingParams(max_tokens=60, temperature=0)
    short_params = SamplingParams(max_tokens=10, temperature=0)
    alone = (await engine.complete(short_ids, short_params, sources["qv"])).text

    order: list[str] = []
    steps = engine.steps
    joined = asyncio.Event()

    async def long_request() -> str:
        text = []
        async for piece in engine.generate(long_ids, long_params):
            text.append(piece.text)
            order.append("long")
            if len(order) == 5:
                joined.set()
        return "".join(text)

    async def short_request() -> str:
        await joined.wait()
        text = []
        async for piece in engine.generate(short_ids, short_params, sources["qv"]):
            text.append(piece.text)
            order.append("short")
        return "".join(text)

    long_text, short_text = await asyncio.gather(long_request(), short_request())
    assert short_text == alone
    # The short request finished while the long one was still producing text...
    last_short = max(i for i, who in enumerate(order) if who == "short")
    assert "long" in order[last_short:]
    # ...and the two shared decode steps (one batch), rather than one waiting for the other.
    assert engine.steps - steps < long_params.max_tokens + short_params.max_tokens - 5
    assert long_text


async def test_stop_strings_cut_the_text_and_are_never_streamed(engine: Engine) -> None:
    ids = engine.encode(PROMPTS[1])
    full = (await engine.complete(ids, GREEDY)).text
    stop = full[6:9]
    assert len(stop) == 3
    assert full.find(stop) == 6
    pieces = await collect(
        engine, ids, SamplingParams(max_tokens=24, temperature=0, stop=(stop, "zzz-never"))
    )
    assert "".join(p.text for p in pieces) == full[:6]
    assert pieces[-1].finish_reason == "stop"
    assert all(stop[:2] not in p.text for p in pieces)


async def test_token_level_requests_get_their_tokens_logprobs_and_stop_tokens(
    engine: Engine, tiny_model_dir: Path
) -> None:
    """What the Tinker API's sampling needs: the ids, each one's log-probability as a
    trainer's forward computes it, and stop tokens in place of end-of-sequence."""
    from transformers import AutoModelForCausalLM

    ids = engine.encode(PROMPTS[1])
    greedy = await engine.complete(ids, SamplingParams(max_tokens=12, temperature=0, logprobs=True))
    tokens = list(greedy.tokens)
    assert len(tokens) == greedy.completion_tokens
    assert greedy.logprobs is not None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(greedy.logprobs), expected, atol=1e-4)

    # Top-k of 1 draws what greedy picks; without logprobs none come back.
    top1 = await engine.complete(ids, SamplingParams(max_tokens=12, top_k=1, seed=3))
    assert list(top1.tokens) == tokens
    assert top1.logprobs is None
    # A stop token ends the completion at its first occurrence, itself included.
    stop = tokens[4]
    stopped = await engine.complete(
        ids, SamplingParams(max_tokens=12, temperature=0, stop_tokens=(stop,))
    )
    assert list(stopped.tokens) == tokens[: tokens.index(stop) + 1]
    assert stopped.finish_reason == "stop"
    # No stop tokens at all: max_tokens, whatever the model says.
    endless = await engine.complete(
        ids, SamplingParams(max_tokens=20, temperature=0, stop_tokens=())
    )
    assert endless.completion_tokens == 20
    assert endless.finish_reason == "length"

    # Prompt log-probabilities, from a prefill shared by prompts of other lengths (padded).
    short, long = engine.encode(PROMPTS[2]), engine.encode(PROMPTS[1])
    # With them, the k most likely tokens at each prompt position and each generated one.
    asked = SamplingParams(
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        prompt_logprobs=True,
        prompt_top_logprobs=3,
    )
    scored = await asyncio.gather(*(engine.complete(p, asked) for p in (short, long)))
    for prompt, piece in zip((short, long), scored, strict=True):
        assert piece.prompt_logprobs is not None
        assert len(piece.prompt_logprobs) == len(prompt)
        assert math.isnan(piece.prompt_logprobs[0])  # nothing before the first token
        with torch.no_grad():
            every = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        expected = every[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(piece.prompt_logprobs[1:]), expected, atol=1e-4)
        top = piece.prompt_top_logprobs
        assert top is not None
        assert len(top) == len(prompt)
        assert top[0] is None
        for i, position in enumerate(top[1:]):
            assert position is not None
            values = torch.tensor([v for _, v in position])
            assert torch.allclose(values, every[i].topk(3).values, atol=1e-4)
            scores = dict(position)
            if prompt[i + 1] in scores:  # the actual token among them: the same score
                assert scores[prompt[i + 1]] == pytest.approx(piece.prompt_logprobs[i + 1])
        # Greedy: each token is its position's best, with its own log-probability.
        assert piece.logprobs is not None
        assert piece.top_logprobs is not None
        assert len(piece.top_logprobs) == len(piece.tokens) == 3
        for token, logprob, alternatives in zip(
            piece.tokens, piece.logprobs, piece.top_logprobs, strict=True
        ):
            assert len(alternatives) == 3
            assert alternatives[0] == (token, pytest.approx(logprob))
            values = [v for _, v in alternatives]
            assert values == sorted(values, reverse=True)


async def test_seeded_sampling_is_reproducible_in_any_batch(engine: Engine, sources: dict) -> None:
    ids = engine.encode(PROMPTS[0])

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=seed)

    alone = (await engine.complete(ids, params(7), sources["all"])).text
    # The same request again, now sharing its batch with others.
    crowd = await asyncio.gather(
        engine.complete(ids, params(7), sources["all"]),
        engine.complete(ids, params(8), sources["all"]),
        engine.complete(ids, params(9), sources["qv"]),
        engine.complete(ids, GREEDY),
    )
    assert crowd[0].text == alone
    others = {
        (await engine.complete(ids, params(seed), sources["all"])).text for seed in (8, 10, 11)
    }
    assert crowd[1].text in others
    assert others - {alone}, "other seeds should give other samples"


async def test_a_prompt_longer_than_the_context_is_refused(engine: Engine) -> None:
    with pytest.raises(ContextLengthExceeded, match="context is 512"):
        await collect(engine, engine.encode("hello"), SamplingParams(max_tokens=600))


async def test_an_adapter_whose_digest_does_not_match_is_refused(
    engine: Engine, sources: dict, tmp_path: Path
) -> None:
    tampered_dir = tmp_path / "tampered"
    shutil.copytree(sources["qv"].path, tampered_dir)
    digests = digests_of(tampered_dir)
    weights = tampered_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    bad = AdapterSource("qv-tampered", tampered_dir, digests)
    with pytest.raises(AdapterUnavailable, match="does not match the recorded"):
        await collect(engine, engine.encode("hi"), GREEDY, bad)
    assert "qv-tampered" not in engine.adapters.loaded()
    unlisted = AdapterSource("qv-unlisted", sources["qv"].path, {})
    with pytest.raises(AdapterUnavailable, match="no recorded sha256"):
        await collect(engine, engine.encode("hi"), GREEDY, unlisted)
    # The engine keeps serving.
    assert (await engine.complete(engine.encode("hi"), GREEDY, sources["qv"])).text


def test_adapters_peft_options_the_kernel_cannot_reproduce_are_refused(
    sources: dict, tmp_path: Path
) -> None:
    dora = tmp_path / "dora"
    shutil.copytree(sources["qv"].path, dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    with pytest.raises(AdapterError, match="DoRA"):
        read_adapter(AdapterSource("dora", dora, digests_of(dora)))


def test_an_adapter_for_another_base_model_is_refused(base: tuple, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{prefix}.lora_A.weight": torch.ones(4, 32),
            f"{prefix}.lora_B.weight": torch.ones(64, 4),
        },
        str(other / "adapter_model.safetensors"),
    )
    (other / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8})
    )
    model, _ = load_base_model(base[0].name_or_path, torch.device("cpu"), torch.float32)
    cache = AdapterCache(LoraSlots(model, 2))
    with pytest.raises(AdapterError, match="trained on another base model"):
        cache.acquire(AdapterSource("other", other, digests_of(other)))
    assert cache.loaded() == []


def test_the_least_recently_used_idle_adapter_is_evicted(
    tiny_model_dir: Path, sources: dict
) -> None:
    model, _ = load_base_model(tiny_model_dir, torch.device("cpu"), torch.float32)
    cache = AdapterCache(LoraSlots(model, 2))
    qv, all_, mlp = sources["qv"], sources["all"], sources["mlp"]
    assert cache.acquire(qv) == 1
    assert cache.acquire(all_) == 2
    # Both pinned (in use): a third must wait rather than evict a running adapter.
    assert cache.acquire(mlp) is None
    cache.release("qv")
    cache.release("all")
    assert cache.acquire(qv) == 1  # qv is now the most recently used
    cache.release("qv")
    assert cache.acquire(mlp) == 2  # so "all" goes
    assert cache.loaded() == ["qv", "mlp"]
    assert cache.evictions == 1
    # The evicted adapter's slot was rewritten: "mlp" targets no attention layer.
    q_proj = model.get_submodule("model.layers.0.self_attn.q_proj")
    assert not q_proj.lora_a[2].any()
    assert q_proj.lora_a[1].any()


async def test_more_adapters_than_slots_are_all_served(tiny_model_dir: Path, sources: dict) -> None:
    model, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"), torch.float32)
    with Engine(model, tokenizer, max_batch_size=8, adapter_slots=1) as small:
        ids = small.encode(PROMPTS[0])
        want = {n: (await small.complete(ids, GREEDY, s)).text for n, s in sources.items()}
        # Three adapters, one slot: requests wait for the slot, none fails or mixes weights.
        got = await asyncio.gather(*(small.complete(ids, GREEDY, s) for s in sources.values()))
        assert [g.text for g in got] == list(want.values())
        assert small.adapters.evictions >= 4


async def test_prompt_targets_and_alternatives_come_with_the_last_piece(
    engine: Engine, tiny_model_dir: Path
) -> None:
    """The engine's prefill answers the named ids' log-probabilities and the draws at each
    prompt position, as the model's forward computes them."""
    prompt = engine.encode(PROMPTS[1])
    targets = tuple((prompt[p + 1], -1) for p in range(len(prompt) - 1))
    params = SamplingParams(
        max_tokens=2, temperature=0.7, seed=2, prompt_targets=targets, prompt_alt_tokens=3
    )
    piece, other = await asyncio.gather(
        engine.complete(prompt, params), engine.complete(engine.encode(PROMPTS[2]), GREEDY)
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True).eval()
    with torch.no_grad():
        every = model(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(-1)
    assert piece.prompt_target_logprobs is not None
    got = torch.tensor(piece.prompt_target_logprobs)
    expected = every.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(got[:, 0], expected, atol=1e-4)
    assert (got[:, 1] == 0.0).all()
    assert piece.prompt_alt_tokens is not None
    assert [len(d) for d in piece.prompt_alt_tokens] == [3] * (len(prompt) - 1)
    for position, draws in enumerate(piece.prompt_alt_tokens):
        for token, logprob in draws:
            assert logprob == pytest.approx(float(every[position, token]), abs=1e-4)
    assert other.prompt_alt_tokens is None
    assert other.prompt_target_logprobs is None

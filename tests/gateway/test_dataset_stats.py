"""Dataset stats with a real model tokenizer, and a big dataset rejected at its bad line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from swarm import AsyncClient, NotFoundError, ValidationError

from ..conftest import ServerThread
from ..scheduler.conftest import write_fake_model
from .conftest import ADMIN, ALICE


def word_tokenizer(path: Path) -> None:
    """One token per whitespace-separated word: token counts are easy to predict exactly."""
    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(path))


async def test_token_percentiles_with_the_models_tokenizer(
    tenant_stack: ServerThread, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    write_fake_model(model_dir)
    word_tokenizer(model_dir / "tokenizer.json")
    bare = tmp_path / "bare"
    write_fake_model(bare)
    data = tmp_path / "d.jsonl"
    # Example i has i words (1..100): p50 = 50, p90 = 90, p99 = 99, max = 100 tokens.
    data.write_text(
        "".join(json.dumps({"text": " ".join(["a"] * i)}) + "\n" for i in range(1, 101))
    )
    async with AsyncClient(tenant_stack.url, api_key=ADMIN) as admin:
        await admin.add_model("wordy", model_dir)
        await admin.add_model("bare", bare)
    async with AsyncClient(tenant_stack.url, api_key=ALICE) as c:
        ds = (await c.upload_dataset(data)).id
        plain = await c.dataset_stats(ds)
        assert plain["examples"] == 100
        assert plain["tokens"] is None
        assert plain["chars"]["max"] == 2 * 100 - 1

        exact = await c.dataset_stats(ds, model="wordy@1")
        assert exact["model"] == "wordy@1"
        assert exact["token_method"] == "tokenizer.json"
        tokens = exact["tokens"]
        assert (tokens["p50"], tokens["p90"], tokens["p99"], tokens["max"]) == (50, 90, 99, 100)
        assert exact["over_seq_len"]["128"] == 0

        rough = await c.dataset_stats(ds, model="bare")
        assert rough["token_method"].startswith("approximate")
        assert rough["tokens"]["max"] == 50  # ceil(199 chars / 4)

        with pytest.raises(ValidationError):
            await c.dataset_stats(ds, model="Not A Model")
        with pytest.raises(NotFoundError) as missing:
            await c.dataset_stats(ds, model="nope")
        assert missing.value.status_code == 404
    async with AsyncClient(tenant_stack.url, api_key=ADMIN) as admin:
        with pytest.raises(NotFoundError) as other:
            await admin.dataset_stats(ds)  # alice's dataset: not the admin tenant's
        assert other.value.status_code == 404


async def test_ten_thousand_lines_one_bad(live_gateway: ServerThread, tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) for i in range(10_000)]
    lines[7320] = json.dumps({"prompt": "q7320"})  # line 7,321 lacks its completion
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    async with AsyncClient(live_gateway.url) as c:
        with pytest.raises(ValidationError) as bad:
            await c.upload_dataset(path)
        assert bad.value.status_code == 422
        assert "line 7321" in str(bad.value)
        assert await c.list_datasets() == []
        lines[7320] = json.dumps({"prompt": "q7320", "completion": "a7320"})
        path.write_text("\n".join(lines) + "\n")
        assert (await c.upload_dataset(path)).examples == 10_000


def test_a_preference_pair_counts_its_prompt_and_longer_answer() -> None:
    from swarm_gateway.dataset_stats import example_text

    pair = {"prompt": "Q?", "chosen": " yes", "rejected": " no, never"}
    assert example_text(pair) == "Q? no, never"
    chat = {
        "prompt": [{"role": "user", "content": "Q?"}],
        "chosen": [{"role": "assistant", "content": "yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    assert example_text(chat) == "user: Q?\nassistant: yes"
    openai = {
        "input": {"messages": [{"role": "user", "content": "Q?"}]},
        "preferred_output": [{"role": "assistant", "content": "a long answer"}],
        "non_preferred_output": [{"role": "assistant", "content": "short"}],
    }
    assert example_text(openai) == "user: Q?\nassistant: a long answer"


def test_a_big_dataset_is_measured_in_one_pass_on_a_sample_with_its_error_stated(
    tmp_path: Path,
) -> None:
    from swarm_gateway.dataset_stats import measure, over_seq_len, percentiles, stated_error

    # 50,000 examples of 1..1000 characters, evenly: the true p50 is 500, p90 900.
    path = tmp_path / "big.jsonl"
    path.write_text(
        "".join(json.dumps({"text": "x" * (1 + i % 1000)}) + "\n" for i in range(50_000))
    )
    sampled = measure(path, None, sample=4_000, seed=1)
    assert sampled.sampled
    assert sampled.examples == 50_000
    assert (sampled.chars_mean, sampled.chars_max) == (500.5, 1000)  # exact, not sampled
    assert len(sampled.chars) == 4_000
    error = stated_error(50_000, 4_000)
    assert "±1.5 points" in error  # 1.96 * 0.5 / sqrt(4000)
    assert "±775" in error
    # The sample's percentiles are where the error says: p50 within 1.5 % of ranks.
    chars = percentiles(sampled.chars)
    assert 485 <= chars.p50 <= 515
    assert 885 <= chars.p90 <= 915
    # Counts scaled to the whole: examples over 128 tokens (chars / 4 > 128: 488 of 1000).
    assert abs(over_seq_len(sampled.tokens, sampled.examples)["128"] - 24_400) <= 775
    assert measure(path, None, sample=4_000, seed=1) == sampled  # seeded: the same answer

    whole = measure(path, None, sample=100_000)
    assert not whole.sampled
    assert len(whole.chars) == 50_000
    assert over_seq_len(whole.tokens, whole.examples)["128"] == 24_400

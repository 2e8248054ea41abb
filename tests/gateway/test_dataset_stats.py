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

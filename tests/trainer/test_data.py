from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarm_trainer.data import (
    IGNORE_INDEX,
    BatchSampler,
    DatasetError,
    encode_example,
    read_jsonl,
    shard,
    split_holdout,
    tokenize,
)


def test_prompt_tokens_are_masked(tokenizer: Any) -> None:
    prompt, completion = "Question: what is 2 plus 2? Answer:", " 4."
    e = encode_example({"prompt": prompt, "completion": completion}, tokenizer, 256)
    assert e is not None
    n_prompt = len(tokenizer.encode(prompt, add_special_tokens=False))
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    # bos + prompt are context, completion + eos are targets.
    assert e.labels[: 1 + n_prompt] == [IGNORE_INDEX] * (1 + n_prompt)
    assert e.labels[1 + n_prompt :] == [*completion_ids, tokenizer.eos_token_id]
    assert e.input_ids[1 + n_prompt :] == e.labels[1 + n_prompt :]


def test_text_trains_on_everything_and_chat_on_assistant_only(tokenizer: Any) -> None:
    e = encode_example({"text": "hello world"}, tokenizer, 256)
    assert e is not None
    assert e.labels[1:] == e.input_ids[1:]
    chat = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    c = encode_example(chat, tokenizer, 256)
    assert c is not None
    targets = [t for t in c.labels if t != IGNORE_INDEX]
    answer = tokenizer.encode("hello\n", add_special_tokens=False)
    assert targets == [*answer, tokenizer.eos_token_id]


def test_truncation_and_fully_masked_examples_dropped(tokenizer: Any) -> None:
    long = {"prompt": "word " * 100, "completion": " end"}
    assert encode_example(long, tokenizer, 16) is None  # nothing to learn once truncated
    e = encode_example({"text": "word " * 100}, tokenizer, 16)
    assert e is not None
    assert len(e.input_ids) == 16 == len(e.labels)
    with pytest.raises(DatasetError):
        tokenize([long], tokenizer, 16)
    with pytest.raises(DatasetError, match="unsupported"):
        encode_example({"foo": 1}, tokenizer, 16)


def test_shards_are_disjoint_and_cover_everything() -> None:
    items = list(range(103))
    shards = [shard(items, r, 4) for r in range(4)]
    assert sorted(i for s in shards for i in s) == items
    for a in range(4):
        for b in range(a + 1, 4):
            assert not set(shards[a]) & set(shards[b])


def test_holdout_split_is_deterministic() -> None:
    items = list(range(50))
    train, val = split_holdout(items, 0.1, seed=7)
    assert (train, val) == split_holdout(items, 0.1, seed=7)
    assert len(val) == 5
    assert not set(train) & set(val)
    assert sorted(train + val) == items
    assert split_holdout(items, 0.1, seed=8)[1] != val
    assert split_holdout(items, 0.0, seed=7) == (items, [])


def test_batches_are_padded_and_repeatable(tokenizer: Any) -> None:
    records = [{"prompt": f"q{i}" * (i % 5 + 1), "completion": f" a{i}"} for i in range(20)]
    examples = tokenize(records, tokenizer, 64)
    a, b = BatchSampler(examples, 4, 0, seed=1), BatchSampler(examples, 4, 0, seed=1)
    for i in (0, 3, 7, 12):  # random access: resuming at any index gives the same batch
        ba, bb = a.batch(i).inputs, b.batch(i).inputs
        assert all((ba[k] == bb[k]).all() for k in ba)
    batch = a.batch(0).inputs
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert ((batch["attention_mask"] == 0) <= (batch["labels"] == IGNORE_INDEX)).all()


def test_read_jsonl_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n\nnot json\n")
    with pytest.raises(DatasetError, match="line 3"):
        read_jsonl(path)


def test_failure_reasons_are_one_readable_line() -> None:
    from swarm_trainer.agent import readable

    ray_text = (
        "Training failed due to worker errors:\n[Rank 0 Error Snippet]:\n"
        'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "swarm_trainer.data.DatasetError: unsupported example with keys ['foo']\n"
    )
    assert readable(RuntimeError(ray_text)) == "DatasetError: unsupported example with keys ['foo']"
    assert readable(ValueError("")) == "ValueError"

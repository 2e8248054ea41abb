from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarm_trainer.data import (
    IGNORE_INDEX,
    BatchSampler,
    DatasetError,
    read_jsonl,
    shard,
    split_holdout,
)
from swarm_trainer.methods.sft import tokenize


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
    from swarm_trainer.attempt import readable

    ray_text = (
        "Training failed due to worker errors:\n[Rank 0 Error Snippet]:\n"
        'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "swarm_trainer.data.DatasetError: unsupported example with keys ['foo']\n"
    )
    assert readable(RuntimeError(ray_text)) == "DatasetError: unsupported example with keys ['foo']"
    assert readable(ValueError("")) == "ValueError"

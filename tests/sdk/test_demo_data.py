from __future__ import annotations

import json
from pathlib import Path

from swarm.demo_data import generate, write_demo_datasets
from swarm_gateway.dataset_validation import validate_jsonl


def test_generate_is_deterministic() -> None:
    assert generate(300, seed=0) == generate(300, seed=0)
    assert generate(300, seed=0) != generate(300, seed=1)
    rows = generate(50)
    assert all(set(r) == {"prompt", "completion"} for r in rows)
    add = next(r for r in rows if r["prompt"].startswith("add"))
    a, b = (int(x) for x in add["prompt"].split()[1:3])
    assert add["completion"] == f" {a + b}"


def test_demo_files_are_byte_identical_and_valid(tmp_path: Path) -> None:
    train1, val1 = write_demo_datasets(tmp_path / "a")
    train2, _ = write_demo_datasets(tmp_path / "b")
    assert train1.read_bytes() == train2.read_bytes()
    summary = validate_jsonl(train1)
    assert summary.format == "prompt_completion"
    assert summary.examples >= 300
    assert json.loads(val1.read_text().splitlines()[0])

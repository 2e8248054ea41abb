from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from swarm.demo_data import SCHEMA, generate, question, sentence, write_demo_datasets
from swarm_gateway.dataset_validation import validate_jsonl


def test_generate_is_deterministic_and_answers_in_the_schema() -> None:
    assert generate(300, seed=0) == generate(300, seed=0)
    assert generate(300, seed=0) != generate(300, seed=1)
    rows = generate(50, seed=0)
    assert len({question(r) for r in rows}) == 50
    for row in rows:
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        answer = json.loads(assistant["content"])
        jsonschema.validate(answer, SCHEMA)
        assert user["content"] == sentence(answer["name"], answer["age"], answer["city"])


def test_demo_files_are_byte_identical_valid_and_held_out(tmp_path: Path) -> None:
    train1, val1 = write_demo_datasets(tmp_path / "a")
    train2, _ = write_demo_datasets(tmp_path / "b")
    assert train1.read_bytes() == train2.read_bytes()
    summary = validate_jsonl(train1)
    assert summary.format == "chat"
    assert summary.examples >= 300
    train = {question(json.loads(line)) for line in train1.read_text().splitlines()}
    held_out = [question(json.loads(line)) for line in val1.read_text().splitlines()]
    assert len(held_out) == 40
    assert not train & set(held_out)

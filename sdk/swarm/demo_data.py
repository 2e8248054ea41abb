"""The demo's task: answer a sentence about a person with one fixed JSON shape, as chats
generated deterministically.

user ``ada is 36 years old and lives in oslo.`` -> assistant ``{"name": "ada", "age": 36,
"city": "oslo"}``. The tiny base model (``swarm models create-tiny``) was pretrained on such
sentences and on copying words, but has never seen JSON: it cannot answer in that shape. The
held-out set's sentences are ones the training set never has. Chats, so that ``swarm chat``
asks the adapter exactly as it was trained.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = (
    "ada", "alan", "anna", "ben", "cleo", "dan", "eva", "finn", "grace", "hugo", "ida", "jack",
    "kim", "leo", "maya", "nina", "omar", "paul", "quinn", "rosa", "sam", "tara", "uma", "vera",
    "will", "xena", "yuri", "zoe",
)  # fmt: skip
CITIES = (
    "paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "dakar", "kyiv",
    "hanoi", "seoul", "bern", "doha", "riga", "sofia", "accra", "baku", "minsk", "nice",
)  # fmt: skip
# What every answer must be (the demo's ``json_valid`` grader checks it).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


Chat = dict[str, list[dict[str, str]]]


def sentence(name: str, age: int, city: str) -> str:
    return f"{name} is {age} years old and lives in {city}."


def example(name: str, age: int, city: str) -> Chat:
    answer = json.dumps({"name": name, "age": age, "city": city})
    return {
        "messages": [
            {"role": "user", "content": sentence(name, age, city)},
            {"role": "assistant", "content": answer},
        ]
    }


def question(row: Chat) -> str:
    return row["messages"][0]["content"]


def generate(n: int, seed: int, exclude: set[str] | None = None) -> list[Chat]:
    """``n`` distinct examples, none whose question is in ``exclude``; the same arguments
    always give the same list."""
    rng = random.Random(seed)
    rows: list[Chat] = []
    seen = set(exclude or ())
    while len(rows) < n:
        row = example(rng.choice(NAMES), rng.randint(18, 90), rng.choice(CITIES))
        if question(row) not in seen:
            seen.add(question(row))
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[Chat]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


def write_demo_datasets(directory: Path, n_train: int = 400, n_val: int = 40) -> tuple[Path, Path]:
    """The training set and the held-out set (its sentences never in training)."""
    train_rows = generate(n_train, seed=0)
    held_out = generate(n_val, seed=1, exclude={question(r) for r in train_rows})
    train = write_jsonl(directory / "demo-train.jsonl", train_rows)
    val = write_jsonl(directory / "demo-heldout.jsonl", held_out)
    return train, val

"""The demo's task: turn a sentence about a person into one fixed JSON shape, generated
deterministically.

``ada is 36 years old and lives in oslo. json:`` -> ``{"name": "ada", "age": 36, "city":
"oslo"}``. The tiny base model (``swarm models create-tiny``) was pretrained on such sentences
and on copying words, but has never seen JSON: it cannot answer in that shape. The held-out
set's sentences are ones the training set never has.
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


def example(name: str, age: int, city: str) -> dict[str, str]:
    answer = json.dumps({"name": name, "age": age, "city": city})
    return {
        "prompt": f"{name} is {age} years old and lives in {city}. json:",
        "completion": f" {answer}",
    }


def generate(n: int, seed: int, exclude: set[str] | None = None) -> list[dict[str, str]]:
    """``n`` distinct examples, none whose prompt is in ``exclude``; the same arguments always
    give the same list."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen = set(exclude or ())
    while len(rows) < n:
        row = example(rng.choice(NAMES), rng.randint(18, 90), rng.choice(CITIES))
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


def write_demo_datasets(directory: Path, n_train: int = 400, n_val: int = 40) -> tuple[Path, Path]:
    """The training set and the held-out set (its sentences never in training)."""
    train_rows = generate(n_train, seed=0)
    held_out = generate(n_val, seed=1, exclude={r["prompt"] for r in train_rows})
    train = write_jsonl(directory / "demo-train.jsonl", train_rows)
    val = write_jsonl(directory / "demo-heldout.jsonl", held_out)
    return train, val

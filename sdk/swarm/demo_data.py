"""The demo's dataset: a small, learnable prompt/completion task, generated deterministically.

The task maps a word to its letters reversed and adds small sums, so that a tiny model's
validation loss visibly drops within a few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "cat",
    "dog",
    "sun",
    "moon",
    "tree",
    "bird",
    "fish",
    "rain",
    "snow",
    "star",
    "leaf",
    "rock",
    "wind",
    "fire",
    "lake",
    "road",
    "ship",
    "coin",
    "bell",
    "lamp",
    "door",
    "book",
    "king",
    "frog",
    "milk",
    "corn",
    "bear",
    "wolf",
    "duck",
    "rose",
    "salt",
)


def generate(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """``n`` examples; the same ``(n, seed)`` always gives the same list."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    for _ in range(n):
        if rng.random() < 0.5:
            word = rng.choice(WORDS)
            rows.append({"prompt": f"reverse {word} ->", "completion": f" {word[::-1]}"})
        else:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            rows.append({"prompt": f"add {a} {b} ->", "completion": f" {a + b}"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


def write_demo_datasets(directory: Path, n_train: int = 320, n_val: int = 48) -> tuple[Path, Path]:
    """Train and validation files with different seeds, so validation measures generalisation."""
    train = write_jsonl(directory / "demo-train.jsonl", generate(n_train, seed=0))
    val = write_jsonl(directory / "demo-val.jsonl", generate(n_val, seed=1))
    return train, val

"""Length statistics of a stored dataset: characters always, tokens once a model is chosen.

Token counts come from the model's own ``tokenizer.json`` loaded with the ``tokenizers``
package (Rust, no torch), so the gateway stays light. Without a ``tokenizer.json`` the counts
are an approximation (characters / 4) and the answer says so. Chat examples are measured as
``role: content`` lines joined together; the trainer's chat template adds a few tokens per
message on top, so treat chat percentiles as a slight underestimate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

CHARS_PER_TOKEN = 4.0
_BATCH = 512


class Percentiles(BaseModel):
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float


class DatasetStats(BaseModel):
    dataset: str
    format: str
    examples: int
    bytes: int
    chars: Percentiles
    model: str | None = Field(default=None, description="name@version whose tokenizer was used")
    tokens: Percentiles | None = None
    token_method: str | None = Field(
        default=None, description="'tokenizer.json' (exact) or 'approximate (chars/4)'"
    )
    over_seq_len: dict[str, int] = Field(
        default_factory=dict,
        description="examples longer than common seq_len values, in tokens",
    )


def percentiles(values: Sequence[float]) -> Percentiles:
    ordered = sorted(values)
    if not ordered:
        return Percentiles(mean=0, p50=0, p90=0, p95=0, p99=0, max=0)

    def at(q: float) -> float:
        # Nearest-rank: always a value that occurs in the data, easy to reason about.
        return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])

    return Percentiles(
        mean=round(sum(ordered) / len(ordered), 2),
        p50=at(0.50),
        p90=at(0.90),
        p95=at(0.95),
        p99=at(0.99),
        max=float(ordered[-1]),
    )


def _chat(messages: list[dict[str, str]]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _chat(value)


def example_text(obj: dict[str, Any]) -> str:
    """What an example trains on; for a preference pair, its prompt and longer answer (the
    longer of its two sequences, which bounds its length)."""
    if "preferred_output" in obj:
        answers = (_chat(obj["preferred_output"]), _chat(obj["non_preferred_output"]))
        return _chat(obj["input"]["messages"]) + "\n" + max(answers, key=len)
    if "chosen" in obj:
        answers = (_text(obj["chosen"]), _text(obj["rejected"]))
        # A chat's answer is a message of its own line; a string answer continues the prompt.
        between = "\n" if isinstance(obj["prompt"], list) else ""
        return _text(obj["prompt"]) + between + max(answers, key=len)
    if "messages" in obj:
        return "\n".join(f"{m['role']}: {m['content']}" for m in obj["messages"])
    if "prompt" in obj:
        return obj["prompt"] + obj["completion"]
    return obj["text"]


def iter_texts(path: Path) -> Iterator[str]:
    """The examples of an already validated JSONL file."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield example_text(json.loads(line))


def token_lengths(path: Path, tokenizer: Any | None) -> tuple[list[int], list[int]]:
    """(chars, tokens) per example; tokens approximate when ``tokenizer`` is None."""
    chars: list[int] = []
    tokens: list[int] = []
    batch: list[str] = []

    def flush() -> None:
        if tokenizer is not None and batch:
            tokens.extend(len(e.ids) for e in tokenizer.encode_batch(batch))
        batch.clear()

    for text in iter_texts(path):
        chars.append(len(text))
        if tokenizer is None:
            tokens.append(math.ceil(len(text) / CHARS_PER_TOKEN))
        else:
            batch.append(text)
            if len(batch) >= _BATCH:
                flush()
    flush()
    return chars, tokens


def over_seq_len(tokens: Sequence[int]) -> dict[str, int]:
    return {str(n): sum(1 for t in tokens if t > n) for n in (128, 256, 512, 1024, 2048, 4096)}

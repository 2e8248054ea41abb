"""Length statistics of a stored dataset: characters always, tokens once a model is chosen.

Computed in one streaming pass over the file, in constant memory: counts, mean and maximum of
the characters are exact; the percentiles and token counts come from every example up to
``SAMPLE`` examples, and beyond that from a uniform sample of ``SAMPLE`` (a reservoir, seeded:
the same file gives the same answer), with the error stated in the answer.

Token counts come from the model's own ``tokenizer.json`` loaded with the ``tokenizers``
package (Rust, no torch), so the gateway stays light. Without a ``tokenizer.json`` the counts
are an approximation (characters / 4) and the answer says so. Chat examples are measured as
``role: content`` lines joined together; the trainer's chat template adds a few tokens per
message on top, so treat chat percentiles as a slight underestimate.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

CHARS_PER_TOKEN = 4.0
_BATCH = 512
# Examples measured exactly; a bigger dataset is measured on a uniform sample this big.
SAMPLE = 20_000
# Two-sided 95 % normal quantile, for the stated error of sampled answers.
Z95 = 1.96


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
    sampled: int | None = Field(
        default=None,
        description="examples measured for the percentiles and token counts when the dataset "
        "has more than can be measured whole; None: all of them",
    )
    error: str | None = Field(default=None, description="how far a sampled answer may be off")


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


class Measured(BaseModel):
    """One pass over a dataset: exact totals, and the lengths of every example or a sample."""

    examples: int
    chars_mean: float
    chars_max: int
    chars: list[int]
    tokens: list[int]
    sampled: bool


def measure(path: Path, tokenizer: Any | None, sample: int = SAMPLE, seed: int = 0) -> Measured:
    """Stream ``path`` once (reservoir sampling beyond ``sample`` examples); token lengths of
    the measured examples, approximate (chars / 4) when ``tokenizer`` is None."""
    rng = random.Random(seed)
    kept: list[str] = []
    n = total = longest = 0
    for text in iter_texts(path):
        n += 1
        total += len(text)
        longest = max(longest, len(text))
        if len(kept) < sample:
            kept.append(text)
        else:
            slot = rng.randrange(n)
            if slot < sample:
                kept[slot] = text
    chars = [len(t) for t in kept]
    if tokenizer is None:
        tokens = [math.ceil(c / CHARS_PER_TOKEN) for c in chars]
    else:
        tokens = []
        for i in range(0, len(kept), _BATCH):
            tokens.extend(len(e.ids) for e in tokenizer.encode_batch(kept[i : i + _BATCH]))
    return Measured(
        examples=n,
        chars_mean=round(total / n, 2) if n else 0.0,
        chars_max=longest,
        chars=chars,
        tokens=tokens,
        sampled=n > len(kept),
    )


def stated_error(examples: int, sampled: int) -> str:
    """The 95 % bound of a uniform sample's answers: a percentile's rank, a count's value."""
    rank = Z95 * 0.5 / math.sqrt(sampled)  # widest at the median
    count = math.ceil(rank * examples)
    return (
        f"measured on a uniform sample of {sampled:,} of {examples:,} examples: each "
        f"percentile is the value at a rank within ±{100 * rank:.1f} points of the one named, "
        f"each over_seq_len count within ±{count:,}, at 95 % confidence (the tokens' max is "
        "the sample's); examples, bytes and the mean and max of chars are exact"
    )


def over_seq_len(tokens: Sequence[int], examples: int | None = None) -> dict[str, int]:
    """Examples longer than common seq_lens; from a sample, scaled to ``examples``."""
    scale = (examples / len(tokens)) if examples and tokens else 1.0
    return {
        str(n): round(scale * sum(1 for t in tokens if t > n))
        for n in (128, 256, 512, 1024, 2048, 4096)
    }

"""Checks an uploaded JSONL dataset before anything trains on it.

One JSON object per line, all in one format: text ``{"text"}``, prompt/completion
``{"prompt", "completion"}`` or chat ``{"messages": [{"role", "content"}, ...]}``. Errors name
the (1-based) line so that a user can fix the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_contracts.datasets import DatasetFormat

MIN_EXAMPLES = 2
CHAT_ROLES = ("system", "user", "assistant", "tool")


class DatasetError(ValueError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@dataclass(frozen=True)
class DatasetSummary:
    format: DatasetFormat
    examples: int


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def classify(obj: dict[str, Any], line: int) -> DatasetFormat:
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise DatasetError("'messages' must be a non-empty list", line)
        for i, m in enumerate(messages):
            if (
                not isinstance(m, dict)
                or not _is_str(m.get("role"))
                or not _is_str(m.get("content"))
            ):
                raise DatasetError(
                    f"messages[{i}] must be an object with string 'role' and 'content'", line
                )
            if m["role"] not in CHAT_ROLES:
                raise DatasetError(
                    f"messages[{i}].role {m['role']!r} is not one of {CHAT_ROLES}", line
                )
        return "chat"
    if "prompt" in obj or "completion" in obj:
        if not _is_str(obj.get("prompt")) or not _is_str(obj.get("completion")):
            raise DatasetError("'prompt' and 'completion' must both be strings", line)
        return "prompt_completion"
    if "text" in obj:
        if not _is_str(obj["text"]) or not obj["text"]:
            raise DatasetError("'text' must be a non-empty string", line)
        return "text"
    raise DatasetError(
        "expected {'text'}, {'prompt','completion'} or {'messages':[{'role','content'}]}", line
    )


def validate_jsonl(path: Path, min_examples: int = MIN_EXAMPLES) -> DatasetSummary:
    fmt: DatasetFormat | None = None
    examples = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    f"not valid UTF-8 ({exc.reason} at byte {exc.start})", number
                ) from exc
            if not text.strip():
                continue  # blank lines (e.g. a trailing newline) carry no example
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"not valid JSON: {exc.msg}", number) from exc
            if not isinstance(obj, dict):
                raise DatasetError("each line must be a JSON object", number)
            line_format = classify(obj, number)
            if fmt is None:
                fmt = line_format
            elif line_format != fmt:
                raise DatasetError(
                    f"format {line_format} differs from earlier lines ({fmt})", number
                )
            examples += 1
    if fmt is None or examples < min_examples:
        raise DatasetError(f"a dataset needs at least {min_examples} examples, found {examples}")
    return DatasetSummary(format=fmt, examples=examples)

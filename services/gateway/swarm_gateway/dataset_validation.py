"""Checks an uploaded JSONL dataset before anything trains on it.

One JSON object per line, all in one format. For supervised fine-tuning: text ``{"text"}``,
prompt/completion ``{"prompt", "completion"}`` or chat ``{"messages": [{"role", "content"},
...]}``. For DPO, preference pairs: ``{"prompt", "chosen", "rejected"}`` as strings, or as
chat messages (``prompt`` a list of messages, ``chosen`` and ``rejected`` lists of messages
ending in an assistant turn), or OpenAI's ``{"input": {"messages"}, "preferred_output",
"non_preferred_output"}``. Errors name the (1-based) line so that a user can fix the file; a
check goes on past a bad line and reports the first ``MAX_REPORTED`` of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_contracts.datasets import DatasetFormat
from swarm_runtime.dataset_codec import CorruptDataset, open_jsonl

MIN_EXAMPLES = 2
# Enough for a user to see the pattern of what is wrong, few enough to read in one answer.
MAX_REPORTED = 20
CHAT_ROLES = ("system", "user", "assistant", "tool")
# A line with any of these is a preference pair (DPO's), whatever else it has.
PREFERENCE_KEYS = ("chosen", "rejected", "input", "preferred_output", "non_preferred_output")


class DatasetError(ValueError):
    """``line``: the first bad line; ``problems``: each bad line's own error, when several."""

    def __init__(
        self, message: str, line: int | None = None, problems: list[DatasetError] | None = None
    ) -> None:
        super().__init__(f"line {line}: {message}" if line and not problems else message)
        self.line = line
        self.problems = problems or []


@dataclass(frozen=True)
class DatasetSummary:
    format: DatasetFormat
    examples: int


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def check_messages(messages: Any, where: str, line: int) -> None:
    """A non-empty list of ``{"role", "content"}`` messages with known roles."""
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"'{where}' must be a non-empty list", line)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not _is_str(m.get("role")) or not _is_str(m.get("content")):
            raise DatasetError(
                f"{where}[{i}] must be an object with string 'role' and 'content'", line
            )
        if m["role"] not in CHAT_ROLES:
            raise DatasetError(f"{where}[{i}].role {m['role']!r} is not one of {CHAT_ROLES}", line)


def check_answer(answer: Any, where: str, line: int) -> None:
    """A preference pair's answer in chat form: messages ending in the assistant's turn."""
    check_messages(answer, where, line)
    if answer[-1]["role"] != "assistant":
        raise DatasetError(f"'{where}' must end with an assistant message", line)


def classify_preference(obj: dict[str, Any], line: int) -> DatasetFormat:
    if "preferred_output" in obj or "non_preferred_output" in obj or "input" in obj:
        source = obj.get("input")
        if not isinstance(source, dict):
            raise DatasetError("'input' must be an object with 'messages'", line)
        check_messages(source.get("messages"), "input.messages", line)
        check_answer(obj.get("preferred_output"), "preferred_output", line)
        check_answer(obj.get("non_preferred_output"), "non_preferred_output", line)
        return "preference_openai"
    if not all(key in obj for key in ("prompt", "chosen", "rejected")):
        missing = [key for key in ("prompt", "chosen", "rejected") if key not in obj]
        raise DatasetError(f"a preference pair needs {', '.join(map(repr, missing))} too", line)
    if isinstance(obj["prompt"], list):
        check_messages(obj["prompt"], "prompt", line)
        check_answer(obj["chosen"], "chosen", line)
        check_answer(obj["rejected"], "rejected", line)
        return "preference_chat"
    for key in ("prompt", "chosen", "rejected"):
        if not _is_str(obj[key]):
            raise DatasetError(
                f"'{key}' must be a string (or, in chat form, every field a list of messages)",
                line,
            )
    if not obj["chosen"] or not obj["rejected"]:
        raise DatasetError("'chosen' and 'rejected' must be non-empty", line)
    return "preference"


def classify(obj: dict[str, Any], line: int) -> DatasetFormat:
    if any(key in obj for key in PREFERENCE_KEYS):
        return classify_preference(obj, line)
    if "messages" in obj:
        check_messages(obj["messages"], "messages", line)
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
        "expected {'text'}, {'prompt','completion'} or {'messages':[{'role','content'}]}, or "
        "for DPO {'prompt','chosen','rejected'} or "
        "{'input':{'messages'},'preferred_output','non_preferred_output'}",
        line,
    )


class JsonlChecker:
    """Checks a dataset one line at a time, so that a file of any size is checked in constant
    memory; it keeps going after a bad line to report the first ``MAX_REPORTED`` of them."""

    def __init__(self, min_examples: int = MIN_EXAMPLES) -> None:
        self.min_examples = min_examples
        self.format: DatasetFormat | None = None
        self.examples = 0
        self.bad_lines = 0
        self.problems: list[DatasetError] = []

    def line(self, number: int, raw: bytes) -> None:
        try:
            self._check(number, raw)
        except DatasetError as exc:
            self.bad_lines += 1
            if len(self.problems) < MAX_REPORTED:
                self.problems.append(exc)

    def _check(self, number: int, raw: bytes) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(
                f"not valid UTF-8 ({exc.reason} at byte {exc.start})", number
            ) from exc
        if not text.strip():
            return  # blank lines (e.g. a trailing newline) carry no example
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"not valid JSON: {exc.msg}", number) from exc
        if not isinstance(obj, dict):
            raise DatasetError("each line must be a JSON object", number)
        line_format = classify(obj, number)
        if self.format is None:
            self.format = line_format
        elif line_format != self.format:
            raise DatasetError(
                f"format {line_format} differs from earlier lines ({self.format})", number
            )
        self.examples += 1

    def summary(self) -> DatasetSummary:
        """The dataset's summary, or a ``DatasetError`` listing the first bad lines."""
        if self.problems:
            first = self.problems[0]
            if self.bad_lines == 1:
                raise first
            shown = "; ".join(str(p) for p in self.problems)
            more = f" (first {len(self.problems)} shown)" if self.bad_lines > MAX_REPORTED else ""
            raise DatasetError(
                f"{self.bad_lines} bad lines{more}: {shown}", first.line, self.problems
            )
        if self.format is None or self.examples < self.min_examples:
            raise DatasetError(
                f"a dataset needs at least {self.min_examples} examples, found {self.examples}"
            )
        return DatasetSummary(format=self.format, examples=self.examples)


def validate_jsonl(path: Path, min_examples: int = MIN_EXAMPLES) -> DatasetSummary:
    """Check a plain, gzip or zstd JSONL file (see ``swarm_runtime.dataset_codec``)."""
    checker = JsonlChecker(min_examples)
    try:
        with open_jsonl(path) as f:
            for number, raw in enumerate(f, start=1):
                checker.line(number, raw)
    except CorruptDataset as exc:
        raise DatasetError(str(exc)) from exc
    return checker.summary()

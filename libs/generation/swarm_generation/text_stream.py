"""Tokens to text, a piece at a time: never half a UTF-8 character, never part of a stop string."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

# Tokens of the prompt decoded ahead of the first new one: tokenizers drop a leading space
# (or merge bytes) differently at the start of a text than inside one.
PROMPT_CONTEXT = 5
REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str | list[str]: ...


class IncrementalDetokenizer:
    """Decodes a window of recent tokens twice per token (what was already shown, and with the
    new token) and returns the difference, holding it back while it ends in an incomplete
    character (U+FFFD), the way vLLM and TGI do."""

    def __init__(self, tokenizer: Decoder, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_ids[-PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence in, one string out
        return text

    def add(self, token_id: int) -> str:
        self.tokens.append(token_id)
        shown = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        text = self._decode(self.tokens[self.prefix_offset :])
        if len(text) > len(shown) and not text.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            return text[len(shown) :]
        return ""

    def flush(self) -> str:
        """What is still held back once generation ends (a truly invalid byte sequence)."""
        shown = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        text = self._decode(self.tokens[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.tokens)
        return text[len(shown) :]


class StopStrings:
    """Cuts the text at the first stop string; while the tail of the text could still become
    one, that tail is held back, so a stream never shows part of a stop string."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = tuple(s for s in stop if s)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def _held(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for size in range(min(self.longest - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self.stop):
                return size
        return 0

    def feed(self, piece: str) -> str:
        """Add generated text; return what may be shown now (``stopped`` tells when to end)."""
        if self.stopped or not piece:
            return ""
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        if self.stop:
            hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(len(self.text) - self._held())

    def finish(self) -> str:
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out


def token_texts(tokenizer: Decoder, ids: Iterable[int], anchor: int) -> dict[int, str]:
    """Each token's own text as it reads inside a text (after ``anchor``, a token before it):
    a token decoded alone may lose its leading space. Special tokens keep their text."""

    def decode(tokens: list[int]) -> str:
        text = tokenizer.decode(tokens, skip_special_tokens=False)
        assert isinstance(text, str)
        return text

    before = decode([anchor])
    texts = {}
    for t in set(ids):
        both = decode([anchor, t])
        texts[t] = both[len(before) :] if both.startswith(before) else decode([t])
    return texts

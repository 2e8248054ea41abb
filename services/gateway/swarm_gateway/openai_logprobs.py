"""OpenAI's ``logprobs`` of a choice, from a worker's chunks (``tokens``, ``logprobs``,
``top_logprobs``, ``token_texts``; ``swarm_contracts.inference``).

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}, ...], "refusal": null}``. Legacy completions: ``{"tokens",
"token_logprobs", "top_logprobs": [{token: logprob}, ...], "text_offset"}``, each position's
dict holding its ``logprobs`` most likely tokens and the chosen one (up to ``logprobs`` + 1,
as OpenAI's), ``text_offset`` counting from the prompt's start. A token's text is how it
reads inside a text (its leading space kept), its ``bytes`` that text's UTF-8; when the
completion ends on an end-of-sequence token, that token is the last entry.

Streamed, each text chunk's event carries the entries of the tokens its text comes from, and
the last event (its ``finish_reason``'s) those of the tokens not sent yet.
"""

from __future__ import annotations

from typing import Any, Literal

from swarm_contracts.inference import GenerateChunk, TokenLogprob

# (text, log-probability, alternatives) of a generated token.
Position = tuple[str, float, list[TokenLogprob]]


class ChoiceLogprobs:
    """One choice's ``logprobs``, chunk by chunk: ``of`` a text chunk gives its tokens'
    entries (None when it has none), ``of`` the done chunk those not given yet."""

    def __init__(self, kind: Literal["chat", "text"], k: int, offset: int = 0) -> None:
        self.kind, self.k = kind, k
        self.offset = offset  # completions: where the next token starts in the text
        self.sent = 0

    def of(self, chunk: GenerateChunk) -> dict[str, Any] | None:
        texts = chunk.token_texts or {}
        tops = chunk.top_logprobs or []
        positions = [
            (texts.get(token, ""), logprob, tops[i] if i < len(tops) else [])
            for i, (token, logprob) in enumerate(
                zip(chunk.tokens or [], chunk.logprobs or [], strict=False)
            )
        ]
        if chunk.kind == "done":
            positions = positions[self.sent :]
        elif not positions:
            return None
        self.sent += len(positions)
        if self.kind == "chat":
            return self._chat(positions, texts)
        return self._completion(positions, texts)

    def _chat(self, positions: list[Position], texts: dict[int, str]) -> dict[str, Any]:
        def entry(text: str, logprob: float) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [
            {
                **entry(text, logprob),
                "top_logprobs": [entry(texts.get(t, ""), v) for t, v in top[: self.k]],
            }
            for text, logprob, top in positions
        ]
        return {"content": content, "refusal": None}

    def _completion(self, positions: list[Position], texts: dict[int, str]) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float] = []
        tops: list[dict[str, float]] = []
        text_offset: list[int] = []
        for text, logprob, top in positions:
            best: dict[str, float] = {}
            for t, v in top[: self.k]:
                best.setdefault(texts.get(t, ""), v)
            best.setdefault(text, logprob)
            tokens.append(text)
            token_logprobs.append(logprob)
            tops.append(best)
            text_offset.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": text_offset,
        }

"""Chat and text completions through the gateway's OpenAI-compatible routes.

The request bodies are OpenAI's; the answers are read into ``Completion`` (whole) or a
stream of ``CompletionChunk`` (text pieces, the last with ``finish_reason`` and ``usage``).
Shared by ``Client`` and ``AsyncClient``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel

from swarm.errors import SwarmError, raise_for
from swarm_contracts.inference import Usage

Messages = str | Sequence[dict[str, Any]]
Kind = Literal["chat", "text"]
CHAT_PATH = "/v1/chat/completions"
TEXT_PATH = "/v1/completions"
# Generation can take a while; the first byte comes after the first token.
TIMEOUT = httpx.Timeout(30.0, read=300.0)


class Completion(BaseModel):
    id: str
    model: str = ""
    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    worker: str | None = None


class CompletionChunk(BaseModel):
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


def as_messages(messages: Messages, system: str | None = None) -> list[dict[str, Any]]:
    """A string is one user message; ``system`` goes first."""
    listed = (
        [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
    )
    return ([{"role": "system", "content": system}] if system else []) + listed


@dataclass(frozen=True)
class Sampling:
    """OpenAI's sampling fields; None leaves the gateway's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | Sequence[str] | None = None
    seed: int | None = None

    def fields(self) -> dict[str, Any]:
        stop = self.stop if self.stop is None or isinstance(self.stop, str) else list(self.stop)
        values = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": stop,
            "seed": self.seed,
        }
        return {k: v for k, v in values.items() if v is not None}


def body(
    kind: Kind, model: str, content: Any, sampling: Sampling, *, stream: bool
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of a chat (``content``: messages) or text (a prompt) request."""
    payload: dict[str, Any] = {"model": model, "stream": stream, **sampling.fields()}
    payload["messages" if kind == "chat" else "prompt"] = content
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return (CHAT_PATH if kind == "chat" else TEXT_PATH), payload


def read_completion(resp: httpx.Response) -> Completion:
    raise_for(resp)
    data = resp.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return Completion(
        id=data["id"],
        model=data.get("model", ""),
        text=text or "",
        finish_reason=choice.get("finish_reason"),
        usage=data.get("usage"),
        worker=resp.headers.get("x-swarm-worker"),
    )


def read_event(line: str) -> CompletionChunk | None:
    """One SSE line of an OpenAI stream: a chunk, None for anything else; raises on an
    error event (the gateway sends one if a worker fails mid-answer)."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    event = json.loads(data)
    if "error" in event:
        error = event["error"] or {}
        raise SwarmError(f"generation failed: {error.get('message', error)}", None, error)
    chunk = CompletionChunk(usage=event.get("usage"))
    for choice in event.get("choices") or []:
        if "delta" in choice:  # chat
            chunk.text += (choice["delta"] or {}).get("content") or ""
        else:  # text completion
            chunk.text += choice.get("text") or ""
        chunk.finish_reason = choice.get("finish_reason") or chunk.finish_reason
    return chunk

"""Answering one generation request on its reply subject: numbered chunks, or one result."""

from __future__ import annotations

import time
from typing import Any

from nats.aio.client import Client

from swarm_contracts.inference import (
    FinishReason,
    GenerateChunk,
    GenerateResult,
    InferenceError,
    TokenLogprob,
    Usage,
)


class Replier:
    """``stream``: every call publishes a ``GenerateChunk`` (``seq`` 0, 1, ...). Otherwise
    text is gathered and ``done``/``error`` publish the one ``GenerateResult``."""

    def __init__(
        self, nc: Client, reply: str, request_id: str, worker_id: str, *, stream: bool
    ) -> None:
        self.nc, self.reply, self.stream = nc, reply, stream
        self.request_id, self.worker_id = request_id, worker_id
        self.seq = 0
        self.model: str | None = None
        self.streamed_text = False
        self._parts: list[str] = []
        self.finished = False
        self.last_sent = time.monotonic()

    async def _chunk(self, chunk: GenerateChunk) -> None:
        await self.nc.publish(self.reply, chunk.model_dump_json(exclude_none=True).encode())
        self.seq += 1
        self.last_sent = time.monotonic()

    def _new(self, kind: str, **fields: object) -> GenerateChunk:
        return GenerateChunk(
            request_id=self.request_id,
            worker_id=self.worker_id,
            seq=self.seq,
            kind=kind,
            **fields,
        )

    async def accepted(self) -> None:
        if self.stream:
            await self._chunk(self._new("accepted"))

    async def keepalive(self) -> None:
        if self.stream and not self.finished:
            await self._chunk(self._new("keepalive"))

    async def text(self, text: str, **tokens: Any) -> None:
        """A piece of text; streamed, with ``tokens`` when given (its tokens' ids,
        ``logprobs``, ``top_logprobs``, ``token_texts``: the result has them all at the end)."""
        if not text:
            return
        if self.stream:
            self.streamed_text = True
            await self._chunk(self._new("text", text=text, model=self.model, **tokens))
        else:
            self._parts.append(text)

    async def done(
        self,
        finish_reason: FinishReason,
        usage: Usage,
        *,
        tokens: list[int] | None = None,
        logprobs: list[float] | None = None,
        prompt_logprobs: list[float | None] | None = None,
        top_logprobs: list[list[TokenLogprob]] | None = None,
        prompt_top_logprobs: list[list[TokenLogprob] | None] | None = None,
        prompt_target_logprobs: list[list[float]] | None = None,
        prompt_alt_tokens: list[list[TokenLogprob]] | None = None,
        token_texts: dict[int, str] | None = None,
    ) -> None:
        """The end: a ``done`` chunk, or the one result; either carries ``tokens``,
        ``logprobs`` and the rest when given (what the request asked)."""
        answer = {
            "tokens": tokens,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "top_logprobs": top_logprobs,
            "prompt_top_logprobs": prompt_top_logprobs,
            "prompt_target_logprobs": prompt_target_logprobs,
            "prompt_alt_tokens": prompt_alt_tokens,
            "token_texts": token_texts,
        }
        self.finished = True
        if self.stream:
            done = self._new(
                "done",
                finish_reason=finish_reason,
                usage=usage,
                model=self.model,
                **answer,
            )
            await self._chunk(done)
            return
        result = GenerateResult(
            request_id=self.request_id,
            worker_id=self.worker_id,
            model=self.model,
            text="".join(self._parts),
            **answer,
            finish_reason=finish_reason,
            usage=usage,
        )
        await self.nc.publish(self.reply, result.model_dump_json(exclude_none=True).encode())

    async def error(self, error: InferenceError) -> None:
        if self.finished:
            return
        self.finished = True
        if self.stream:
            await self._chunk(self._new("error", error=error))
            return
        result = GenerateResult(
            request_id=self.request_id, worker_id=self.worker_id, model=self.model, error=error
        )
        await self.nc.publish(self.reply, result.model_dump_json(exclude_none=True).encode())

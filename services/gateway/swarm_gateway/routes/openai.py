"""OpenAI-compatible ``POST /v1/chat/completions`` and ``POST /v1/completions``.

``model`` is a base model (``tiny-llama``, ``tiny-llama@1``) or one of the caller's adapters
(``support-bot``, ``support-bot@3``, ``support-bot@production``). Streams are Server-Sent
Events in OpenAI's chunk format ending with ``data: [DONE]``; errors use OpenAI's shape
(``swarm_gateway.openai_errors``). Supported: ``max_tokens`` (``max_completion_tokens``),
``temperature``, ``top_p``, ``stop``, ``seed``, ``n`` = 1, ``stream``,
``stream_options.include_usage``, ``response_format`` (``text``, ``json_object``,
``json_schema``: constrained decoding on the worker) and log-probabilities (chat:
``logprobs`` with ``top_logprobs`` 0..20; completions: ``logprobs`` 0..5; in OpenAI's shapes,
``swarm_gateway.openai_logprobs``); other OpenAI fields are ignored, except those whose
absence would change the answer (``n`` > 1, ``tools``, ``echo``, another
``response_format``, ...): 400.

The HTTP status is decided by the first chunk that is not bookkeeping (text, done or an
error), so an unknown adapter, a prompt over the context or a full worker is a 4xx/5xx, not
a 200 with an error inside; ``x-swarm-model`` and ``x-swarm-worker`` name what answered.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from swarm_contracts.inference import (
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    ChatMessage,
    GenerateChunk,
    Role,
)
from swarm_contracts.inference import GenerateRequest as WorkerRequest
from swarm_gateway.auth import Tenant
from swarm_gateway.inference import Target, generate, resolve
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.openai_logprobs import ChoiceLogprobs
from swarm_gateway.state import Gateway, get_gateway

router = APIRouter(tags=["inference"])
GW = Annotated[Gateway, Depends(get_gateway)]
# OpenAI's documented default for /v1/completions; chat defaults to what the context leaves.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# OpenAI's limit on the legacy completions' ``logprobs``.
MAX_COMPLETION_LOGPROBS = 5
# A new answer's ``ChoiceLogprobs`` (None: not asked).
Logprobs = Callable[[], ChoiceLogprobs] | None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    functions: list[Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    # Only 1 is served; the schema says so, so a client learns it from the document.
    best_of: int | None = Field(default=None, ge=1, le=1)
    suffix: str | None = None


def _refuse(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported_parameter")


def _response_format(body: _Sampling) -> dict[str, Any]:
    """The worker request's ``response_format`` (and ``json_schema``) fields, or why not."""
    given = body.response_format or {}
    kind = given.get("type", "text")
    if kind in ("text", "json_object"):
        return {"response_format": kind}
    if kind != "json_schema":
        raise _refuse(
            "response_format",
            f"response_format {kind!r} is not supported (use text, json_object or json_schema)",
        )
    spec = given.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise OpenAIError(
            400,
            "response_format json_schema needs json_schema.schema, a JSON Schema object",
            param="response_format.json_schema.schema",
            code="invalid_value",
        )
    return {"response_format": kind, "json_schema": schema}


def _common_checks(gw: Gateway, body: _Sampling, max_tokens: int | None) -> list[str]:
    _response_format(body)  # refused before any lookup
    if body.n not in (None, 1):
        raise _refuse("n", "only n=1 is supported")
    limit = gw.settings.inference_max_tokens
    if max_tokens is not None and max_tokens > limit:
        raise OpenAIError(
            400,
            f"max_tokens is {max_tokens}, over this service's limit of {limit}",
            param="max_tokens",
            code="invalid_value",
        )
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > MAX_STOP_STRINGS or not all(stop):
        raise OpenAIError(
            400,
            f"stop takes up to {MAX_STOP_STRINGS} non-empty strings",
            param="stop",
            code="invalid_value",
        )
    return stop


def _messages(body: ChatCompletionRequest) -> list[ChatMessage]:
    messages = []
    for i, message in enumerate(body.messages):
        content = message.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise OpenAIError(
                        400,
                        f"messages[{i}].content: only text parts are supported",
                        param=f"messages.{i}.content",
                        code="invalid_value",
                    )
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            raise OpenAIError(
                400,
                f"messages[{i}].content is required",
                param=f"messages.{i}.content",
                code="invalid_value",
            )
        messages.append(ChatMessage(role=message.role, content=content))
    return messages


def _worker_request(
    target: Target,
    tenant: str,
    body: _Sampling,
    max_tokens: int | None,
    stop: list[str],
    top_logprobs: int | None = None,
    **inputs: Any,
) -> WorkerRequest:
    """``top_logprobs``: None, or the alternatives each generated token's answer lists."""
    if top_logprobs is not None:
        inputs.update(logprobs=True, top_logprobs=top_logprobs, token_texts=True)
    return WorkerRequest(
        request_id=uuid.uuid4().hex[:24],
        tenant=tenant,
        base_model=target.base_model,
        base_model_version=target.base_model_version,
        adapter=target.adapter,
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        seed=body.seed,
        **_response_format(body),
        **inputs,
    )


async def _whole(
    gw: Gateway,
    request: WorkerRequest,
    target: Target,
    kind: Literal["chat", "text"],
    completion_id: str,
    created: int,
    logprobs: Logprobs,
) -> JSONResponse:
    """A non-streamed answer. The caller has seen nothing yet, so a worker lost even after
    some text is no failure: the request starts again on another worker (with a seed, the
    same answer)."""
    rounds = gw.settings.inference_attempts
    for round_ in range(1, rounds + 1):
        this = request.model_copy(update={"request_id": f"{request.request_id}r{round_}"})
        parts: list[str] = []
        last: GenerateChunk | None = None
        try:
            async for chunk in generate(gw, this):
                parts.append(chunk.text)
                last = chunk
        except OpenAIError as exc:
            if exc.code == "worker_lost" and parts and round_ < rounds:
                continue
            raise
        break
    assert last is not None
    text = "".join(parts)
    scores = logprobs().of(last) if logprobs is not None else None
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": last.finish_reason,
            "logprobs": scores,
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": last.finish_reason, "logprobs": scores}
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": target.label,
            "choices": [choice],
            "usage": last.usage.model_dump() if last.usage else None,
            "system_fingerprint": None,
        },
        headers={"x-swarm-model": target.label, "x-swarm-worker": last.worker_id},
    )


async def _answer(
    gw: Gateway,
    request: WorkerRequest,
    target: Target,
    body: _Sampling,
    *,
    kind: Literal["chat", "text"],
    logprobs: Logprobs = None,
) -> JSONResponse | StreamingResponse:
    created = int(time.time())
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    completion_id = f"{prefix}-{request.request_id}"
    if not body.stream:
        return await _whole(gw, request, target, kind, completion_id, created, logprobs)
    chunks = generate(gw, request)
    first = await anext(chunks)  # errors before any text become the HTTP status
    headers = {"x-swarm-model": target.label, "x-swarm-worker": first.worker_id}

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    scores = logprobs() if logprobs is not None else None

    def event(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": created,
            "model": target.label,
            "choices": choices,
        }
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    def choice(
        text: str | None, finish: str | None, scores: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if kind == "chat":
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": scores}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": scores}

    async def sse() -> AsyncIterator[bytes]:
        if kind == "chat":
            yield event(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                        "logprobs": None,
                    }
                ]
            )
        try:
            chunk: GenerateChunk | None = first
            while chunk is not None:
                # Each event with its tokens' log-probabilities, when asked; the last with
                # those of the tokens not sent yet.
                entries = scores.of(chunk) if scores is not None else None
                if chunk.kind == "text":
                    yield event([choice(chunk.text, None, entries)])
                else:  # done
                    yield event([choice(None, chunk.finish_reason, entries)])
                    if include_usage and chunk.usage is not None:
                        yield event([], chunk.usage.model_dump())
                chunk = await anext(chunks, None)
        except OpenAIError as exc:
            # Mid-stream: the status is already sent; OpenAI's clients raise on this event.
            yield f"data: {json.dumps(exc.body())}\n\n".encode()
            return
        finally:
            await chunks.aclose()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        sse(),
        media_type="text/event-stream",
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, gw: GW, tenant: Tenant
) -> JSONResponse | StreamingResponse:
    """A chat completion, rendered with the base model's chat template."""
    if body.tools or body.functions:
        raise _refuse("tools", "tools and functions are not supported")
    if body.top_logprobs is not None and not body.logprobs:
        raise OpenAIError(
            400,
            "top_logprobs: logprobs must be set to true if top_logprobs is used",
            param="top_logprobs",
            code="invalid_value",
        )
    max_tokens = body.max_completion_tokens or body.max_tokens
    stop = _common_checks(gw, body, max_tokens)
    messages = _messages(body)
    target = await resolve(gw, body.model, tenant)
    k = (body.top_logprobs or 0) if body.logprobs else None
    request = _worker_request(target, tenant, body, max_tokens, stop, k, messages=messages)
    scores: Logprobs = None if k is None else partial(ChoiceLogprobs, "chat", k)
    return await _answer(gw, request, target, body, kind="chat", logprobs=scores)


@router.post("/v1/completions", response_model=None)
async def completions(
    body: CompletionRequest, gw: GW, tenant: Tenant
) -> JSONResponse | StreamingResponse:
    """A text completion of ``prompt`` (one string)."""
    if body.echo:
        raise _refuse("echo", "echo is not supported")
    if body.suffix:
        raise _refuse("suffix", "suffix is not supported")
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise _refuse("prompt", "give one prompt per request")
        prompt = prompt[0]
    max_tokens = body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    stop = _common_checks(gw, body, max_tokens)
    target = await resolve(gw, body.model, tenant)
    k = body.logprobs
    request = _worker_request(target, tenant, body, max_tokens, stop, k, prompt=prompt)
    offset = len(prompt)  # OpenAI's text_offset counts from the prompt's start
    scores: Logprobs = None if k is None else partial(ChoiceLogprobs, "text", k, offset)
    return await _answer(gw, request, target, body, kind="text", logprobs=scores)

"""Inference over NATS (contract): generation requests, the chunks that answer them, and the
inference workers' heartbeats.

A request goes to ``swarm.inference.<base model>.<version>.generate``, served by a queue
group of the workers holding that base model version. With ``stream`` (the default) the
worker answers with ``GenerateChunk`` messages on the request's reply subject: ``accepted``
first, ``text`` pieces, ``keepalive`` while a request waits or thinks, then ``done`` or
``error``. Without ``stream`` it answers once, with a ``GenerateResult``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm_contracts.jobs import NAME_PATTERN, utcnow

Role = Literal["system", "developer", "user", "assistant"]
MAX_STOP_STRINGS = 4
MAX_STOP_TOKENS = 64
MAX_PROMPT_TOKENS = 131_072
# Alternatives per position (OpenAI's top_logprobs goes up to 20).
MAX_TOP_LOGPROBS = 20
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
FinishReason = Literal["stop", "length"]
ResponseFormat = Literal["text", "json_object", "json_schema"]
# A likely token at a position: (token id, log-probability).
TokenLogprob = tuple[int, float]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str


class GenerateRequest(BaseModel):
    """``swarm.inference.<base>.<version>.generate``: complete ``prompt``, or the chat
    ``messages`` (rendered with the base model's chat template), with ``adapter`` (a ref of
    ``tenant``'s: ``name``, ``name@3``, ``name@production``) or with the base model alone."""

    request_id: str = Field(pattern=REQUEST_ID_PATTERN, description="a subject token")
    tenant: str = Field(pattern=NAME_PATTERN)
    base_model: str = Field(pattern=NAME_PATTERN)
    base_model_version: int = Field(ge=1)
    adapter: str | None = Field(default=None, description="name, name@version or name@alias")
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt_tokens: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PROMPT_TOKENS,
        description="the prompt as token ids (the Tinker API's sampling), sent as they are",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="None: up to the context (and the worker's limit)"
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    seed: int | None = None
    top_k: int = Field(default=-1, ge=-1, description="-1: no limit")
    stop_tokens: list[int] | None = Field(
        default=None,
        max_length=MAX_STOP_TOKENS,
        description="token ids that end the completion (kept in its tokens) instead of the "
        "model's end-of-sequence ones; [] stops only at max_tokens",
    )
    logprobs: bool = Field(
        default=False,
        description="answer each generated token's log-probability (done chunk or result)",
    )
    prompt_logprobs: bool = Field(
        default=False,
        description="answer each prompt token's log-probability given the ones before it",
    )
    top_logprobs: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="answer the k most likely tokens at each generated position, under the "
        "distribution the token was drawn from",
    )
    prompt_top_logprobs: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="answer the k most likely tokens at each prompt position after the first",
    )
    prompt_target_ids: list[list[int]] | None = Field(
        default=None,
        description="with prompt_tokens: token ids whose log-probabilities to answer at each "
        "prompt position after the first, one row per position (len(prompt_tokens) - 1 rows "
        "of one width, at most 20), -1 in a cell that asks for none",
    )
    prompt_alt_tokens: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="answer k tokens drawn (with replacement, at the request's temperature; "
        "greedy: the best one k times) at each prompt position after the first, with their "
        "log-probabilities under the model's own distribution",
    )
    token_texts: bool = Field(
        default=False,
        description="answer the generated tokens and the text of each id in them and in "
        "top_logprobs (OpenAI's logprobs name tokens by their text)",
    )
    response_format: ResponseFormat = Field(
        default="text",
        description="json_object: the text is a JSON object; json_schema: one that json_schema "
        "accepts (constrained decoding)",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None, description="the JSON Schema, with response_format json_schema only"
    )
    stream: bool = True
    attempt: int = Field(default=1, ge=1, description="1, then 2... when a caller retries")

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if sum(x is not None for x in (self.prompt, self.messages, self.prompt_tokens)) != 1:
            raise ValueError("give exactly one of prompt, messages and prompt_tokens")
        if (self.json_schema is None) == (self.response_format == "json_schema"):
            raise ValueError("json_schema goes with response_format json_schema, and only there")
        if self.prompt_target_ids is not None:
            _check_targets(self.prompt_target_ids, self.prompt_tokens)
        return self


def _check_targets(rows: list[list[int]], prompt_tokens: list[int] | None) -> None:
    if prompt_tokens is None:
        raise ValueError("prompt_target_ids goes with prompt_tokens")
    if len(rows) != len(prompt_tokens) - 1:
        raise ValueError(
            f"prompt_target_ids: {len(rows)} rows for {len(prompt_tokens)} prompt tokens "
            "(one per position after the first)"
        )
    widths = {len(row) for row in rows}
    if len(widths) != 1 or not 0 < next(iter(widths)) <= MAX_TOP_LOGPROBS:
        raise ValueError(f"prompt_target_ids: rows of one width, 1..{MAX_TOP_LOGPROBS}")
    if any(token < -1 for row in rows for token in row):
        raise ValueError("prompt_target_ids: token ids, or -1 for none")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class InferenceError(BaseModel):
    """Why a request failed; ``status`` is the HTTP status a gateway answers with."""

    code: str = Field(description="e.g. model_not_found, context_length_exceeded, overloaded")
    message: str
    status: int = 500


class GenerateChunk(BaseModel):
    """One message on a streaming request's reply subject, numbered from 0 by ``seq``.

    With ``token_texts``, a ``text`` chunk also carries ``tokens``, ``logprobs``,
    ``top_logprobs`` and ``token_texts`` of the tokens its text comes from; ``done`` carries
    them all (the stream's sent ones too)."""

    request_id: str
    worker_id: str
    seq: int
    kind: Literal["accepted", "text", "keepalive", "done", "error"]
    text: str = ""
    model: str | None = Field(default=None, description="what runs: base@v or adapter name@v")
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    tokens: list[int] | None = Field(
        default=None,
        description="done: the generated token ids (with prompt_tokens or token_texts)",
    )
    logprobs: list[float] | None = Field(
        default=None, description="done: each generated token's log-probability (with logprobs)"
    )
    prompt_logprobs: list[float | None] | None = Field(
        default=None, description="done: each prompt token's (the first's is null)"
    )
    top_logprobs: list[list[TokenLogprob]] | None = Field(
        default=None,
        description="done: each generated token's k most likely tokens, best first "
        "(with top_logprobs)",
    )
    prompt_top_logprobs: list[list[TokenLogprob] | None] | None = Field(
        default=None,
        description="done: each prompt position's k most likely tokens (the first's is null)",
    )
    prompt_target_logprobs: list[list[float]] | None = Field(
        default=None,
        description="done: the log-probabilities of prompt_target_ids, row for row (0.0 at -1)",
    )
    prompt_alt_tokens: list[list[TokenLogprob]] | None = Field(
        default=None,
        description="done: each prompt position's (after the first) drawn tokens (with "
        "prompt_alt_tokens)",
    )
    token_texts: dict[int, str] | None = Field(
        default=None,
        description="done: the text of each token id in tokens and top_logprobs (with token_texts)",
    )
    error: InferenceError | None = None


class GenerateResult(BaseModel):
    """The one reply to a request with ``stream: false``: the text, or ``error``."""

    request_id: str
    worker_id: str
    model: str | None = None
    text: str = ""
    tokens: list[int] | None = Field(
        default=None, description="the generated token ids (with prompt_tokens or token_texts)"
    )
    logprobs: list[float] | None = Field(
        default=None, description="each generated token's log-probability (with logprobs)"
    )
    prompt_logprobs: list[float | None] | None = Field(
        default=None, description="each prompt token's (the first's is null)"
    )
    top_logprobs: list[list[TokenLogprob]] | None = Field(
        default=None, description="each generated token's k most likely tokens, best first"
    )
    prompt_top_logprobs: list[list[TokenLogprob] | None] | None = Field(
        default=None, description="each prompt position's k most likely tokens"
    )
    prompt_target_logprobs: list[list[float]] | None = Field(
        default=None,
        description="the log-probabilities of prompt_target_ids, row for row (0.0 at -1)",
    )
    prompt_alt_tokens: list[list[TokenLogprob]] | None = Field(
        default=None,
        description="each prompt position's (after the first) drawn tokens (with "
        "prompt_alt_tokens)",
    )
    token_texts: dict[int, str] | None = Field(
        default=None, description="the text of each token id in tokens and top_logprobs"
    )
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: InferenceError | None = None


class CancelGeneration(BaseModel):
    """``swarm.inference.requests.<request_id>.cancel``: the caller went away; the worker
    running the request stops it (and answers nothing more)."""

    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = ""


class HeldModel(BaseModel):
    name: str
    version: int
    max_context: int | None = None


class InferenceHeartbeat(BaseModel):
    """``data`` of ``swarm.inference.workers.<worker_id>.heartbeat``, every few seconds."""

    worker_id: str
    device: str = Field(description="cpu, or cuda:0 (its name)")
    backend: Literal["swarm", "vllm"] = "swarm"
    base_models: list[HeldModel]
    adapters_loaded: list[str] = Field(description="name@version of the adapters in slots")
    adapter_slots: int
    free_slots: int
    max_batch_size: int
    running: int = Field(description="rows in the running batch")
    queue_depth: int = Field(description="requests waiting for a batch row or an adapter slot")
    time: datetime = Field(default_factory=utcnow)

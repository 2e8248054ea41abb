"""Tinker's sampling, on the inference workers' batched engine.

A sampling session names what to sample from: a base model, or the adapter version that
``save_weights_for_sampler`` registered (docs/tinker.md). Each ``asample`` becomes
``num_samples`` token-level generation requests (``swarm_contracts.inference``, with
``prompt_tokens`` and ``logprobs``) sent through the same routing as ``/v1/chat/completions``
(``swarm_gateway.inference.generate``: retried on another worker when one is lost or full),
run concurrently, so that the worker batches them; their answers settle the call's future.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictInt
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from swarm_contracts.inference import MAX_STOP_STRINGS, GenerateRequest
from swarm_gateway.inference import generate
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.state import Gateway
from swarm_gateway.tinker.records import (
    FutureRecord,
    SampledSequence,
    SampleOutcome,
    SamplerRecord,
)
from swarm_runtime.records import RecordTable

log = logging.getLogger(__name__)

# How long a sample waits for room on a full inference worker: a call's own deadline.
QUEUE_S = 600.0


class SamplingError(ValueError):
    """A sampling request the gateway refuses up front: a 400 naming the field."""


class SamplingParams(BaseModel):
    """The SDK's ``SamplingParams``; ranges are checked by the generation request."""

    model_config = ConfigDict(extra="ignore")

    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[StrictInt] | list[str] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


def stops(stop: str | list[int] | list[str] | None) -> tuple[list[str], list[int] | None]:
    """The SDK's ``stop`` as (stop strings, stop tokens): None keeps end-of-sequence, ``[]``
    stops only at max_tokens, ids replace end-of-sequence, strings add to it."""
    if stop is None:
        return [], None
    if isinstance(stop, str):
        return [stop], None
    if not stop:
        return [], []
    if isinstance(stop[0], int):
        return [], [int(x) for x in stop]
    if len(stop) > MAX_STOP_STRINGS:
        raise SamplingError(f"sampling_params.stop: at most {MAX_STOP_STRINGS} strings")
    return [str(x) for x in stop], None


def generate_requests(
    request_id: str,
    sampler: SamplerRecord,
    prompt: list[int],
    num_samples: int,
    params: SamplingParams,
    prompt_logprobs: bool = False,
    topk_prompt: int = 0,
    topk_sample: int = 0,
) -> list[GenerateRequest]:
    """One token-level request per sample; with a seed, sample ``i`` draws with ``seed + i``
    (the same seed for all would give ``num_samples`` copies of one sequence). The prompt's
    log-probabilities and its top-k, when asked, come with the first sample (the prompt is
    the same); each sample carries its own tokens' top-k."""
    strings, tokens = stops(params.stop)
    return [
        GenerateRequest(
            request_id=f"tinker-{request_id}-{i}",
            tenant=sampler.tenant,
            base_model=sampler.base_model,
            base_model_version=sampler.base_model_version,
            adapter=sampler.adapter,
            prompt_tokens=prompt,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=None if params.seed is None else params.seed + i,
            stop=strings,
            stop_tokens=tokens,
            logprobs=True,
            prompt_logprobs=prompt_logprobs and i == 0,
            top_logprobs=topk_sample,
            prompt_top_logprobs=topk_prompt if i == 0 else 0,
        )
        for i in range(num_samples)
    ]


def _full(exc: BaseException) -> bool:
    return isinstance(exc, OpenAIError) and exc.code == "overloaded"


async def sample_one(gw: Gateway, request: GenerateRequest) -> SampledSequence:
    """One sample; while every worker of the base model is full, it waits its turn (for up
    to a call's deadline) rather than failing: a burst of samples queues."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(_full),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        stop=stop_after_delay(QUEUE_S),
        reraise=True,
    ):
        with attempt:
            tries = attempt.retry_state.attempt_number
            this = request.model_copy(update={"request_id": f"{request.request_id}-q{tries}"})
            async for chunk in generate(gw, this):
                if chunk.kind == "done":
                    return SampledSequence(
                        tokens=chunk.tokens or [],
                        logprobs=chunk.logprobs,
                        stop_reason=chunk.finish_reason or "stop",
                        prompt_logprobs=chunk.prompt_logprobs,
                        topk_logprobs=chunk.top_logprobs,
                        topk_prompt_logprobs=chunk.prompt_top_logprobs,
                    )
            raise OpenAIError(502, "the inference worker ended without an answer")
    raise AssertionError("unreachable: the retries return or raise")


async def run(
    gw: Gateway,
    futures: RecordTable[FutureRecord],
    request_id: str,
    requests: list[GenerateRequest],
) -> FutureRecord | None:
    """Generate every sample and settle the future ``request_id`` with them, or with why not
    (a 4xx of the worker's is the caller's mistake: the SDK's ``user`` category)."""
    outcome: SampleOutcome | None = None
    error: str | None = None
    category: Literal["user", "server"] = "server"
    try:
        sequences = await asyncio.gather(*(sample_one(gw, r) for r in requests))
        first = sequences[0] if sequences else None
        prompt = first.prompt_logprobs if first else None
        topk_prompt = first.topk_prompt_logprobs if first else None
        for sequence in sequences:
            sequence.prompt_logprobs = None  # the outcome's, once
            sequence.topk_prompt_logprobs = None
        outcome = SampleOutcome(
            sequences=list(sequences), prompt_logprobs=prompt, topk_prompt_logprobs=topk_prompt
        )
    except OpenAIError as exc:
        error = exc.message
        if 400 <= exc.status < 500:
            category = "user"
    except Exception as exc:
        log.exception("sampling %s failed", request_id)
        error = f"sampling failed: {exc!r}"

    def settle(future: FutureRecord) -> FutureRecord:
        if outcome is not None:
            future.state, future.sample = "done", outcome
        else:
            future.state, future.error, future.category = "failed", error, category
        future.done_at = time.time()
        return future

    written = await futures.modify(request_id, settle)
    return written[0] if written is not None else None

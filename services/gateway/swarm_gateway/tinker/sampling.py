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
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from swarm_contracts.inference import (
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    GenerateRequest,
    TokenLogprob,
)
from swarm_gateway.inference import generate
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.state import Gateway
from swarm_gateway.tinker.records import (
    FutureRecord,
    SampledSequence,
    SampleOutcome,
    SamplerRecord,
    TensorOut,
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


class _TensorBody(BaseModel):
    """The SDK's JSON ``TensorData``."""

    model_config = ConfigDict(extra="ignore")

    data: list[int]
    dtype: str
    shape: list[int] | None = None
    sparse_crow_indices: list[int] | None = None
    sparse_col_indices: list[int] | None = None


FIELD = "target_prompt_logprobs"


@dataclass(frozen=True)
class PromptTargets:
    """A request's ``target_prompt_logprobs``: the cells that name an id, packed to the left of
    their row (``packed``: what the engine gathers, as narrow as the row naming most ids), and
    where each came from, so that the answer takes the request's own layout back."""

    shape: list[int]
    crow: list[int] | None
    col: list[int] | None
    ids: np.ndarray  # every cell in the layout's order (dense: row-major; CSR: its values)
    asked: np.ndarray  # which cells name an id (the others are -1)
    rows: np.ndarray  # each asking cell's row
    slots: np.ndarray  # and its column in ``packed``
    packed: list[list[int]]

    @classmethod
    def parse(cls, raw: Any, prompt_length: int) -> PromptTargets:
        """Read and check the SDK's tensor: int64, ``[len(prompt) - 1, K]``, dense or CSR, at
        least one id; a 400 naming the field otherwise."""
        try:
            body = _TensorBody.model_validate(raw)
        except ValidationError as exc:
            raise SamplingError(f"{FIELD}: not an int64 tensor ({exc.errors()[0]['msg']})") from exc
        if body.dtype != "int64":
            raise SamplingError(f"{FIELD}: an int64 tensor of token ids, not {body.dtype}")
        rows = prompt_length - 1
        if body.shape is None or len(body.shape) != 2 or body.shape[0] != rows:
            raise SamplingError(
                f"{FIELD}: shape {body.shape}, not [len(prompt) - 1, K] = [{rows}, K]"
            )
        width = body.shape[1]
        ids = np.asarray(body.data, dtype=np.int64)
        if body.sparse_crow_indices is None:
            if body.sparse_col_indices is not None or ids.size != rows * width:
                raise SamplingError(f"{FIELD}: {ids.size} values for shape {body.shape}")
            cell_rows = np.repeat(np.arange(rows), width)
        else:
            crow = np.asarray(body.sparse_crow_indices, dtype=np.int64)
            col = np.asarray(body.sparse_col_indices or [], dtype=np.int64)
            if (
                crow.size != rows + 1
                or crow[0] != 0
                or (np.diff(crow) < 0).any()
                or crow[-1] != ids.size
                or col.size != ids.size
                or (col < 0).any()
                or (col >= width).any()
            ):
                raise SamplingError(f"{FIELD}: sparse CSR indices that do not fit {body.shape}")
            cell_rows = np.repeat(np.arange(rows), np.diff(crow))
        if (ids < -1).any():
            raise SamplingError(f"{FIELD}: token ids, or -1 for a cell that asks for none")
        asked = ids >= 0
        if not asked.any():
            raise SamplingError(f"{FIELD}: no token id (every cell is -1)")
        asking_rows = cell_rows[asked]  # in row order: both layouts are row-major
        slots = np.arange(asking_rows.size) - np.searchsorted(asking_rows, asking_rows)
        most = int(slots.max()) + 1
        if most > MAX_TOP_LOGPROBS:
            # The engine's cost is the prompt's length times this width, like a top-k's.
            raise SamplingError(
                f"{FIELD}: {most} ids at one prompt position; at most {MAX_TOP_LOGPROBS}"
            )
        packed = np.full((rows, most), -1, dtype=np.int64)
        packed[asking_rows, slots] = ids[asked]
        return cls(
            shape=list(body.shape),
            crow=body.sparse_crow_indices,
            col=body.sparse_col_indices,
            ids=ids,
            asked=asked,
            rows=asking_rows,
            slots=slots,
            packed=packed.tolist(),
        )

    def answer(self, packed_logprobs: list[list[float]]) -> TensorOut:
        """The engine's log-probabilities of ``packed`` in the request's layout, 0.0 in the
        cells that named none (as the SDK documents)."""
        scores = np.asarray(packed_logprobs, dtype=np.float32).reshape(len(self.packed), -1)
        values = np.zeros(self.ids.size, dtype=np.float32)
        values[self.asked] = scores[self.rows, self.slots]
        return TensorOut(shape=self.shape, values=values.tolist(), crow=self.crow, col=self.col)


def last_n_only(
    prompt_length: int,
    last_n: int | None,
    prompt: list[float | None] | None,
    topk: list[list[TokenLogprob] | None] | None,
) -> tuple[list[float | None] | None, list[list[TokenLogprob] | None] | None]:
    """``prompt_logprobs_last_n``: the prompt's log-probabilities and top-k of its last n
    tokens only, the earlier ones None (the engine scores the whole prompt in one prefill
    anyway: cut here rather than carry one more field to it)."""
    if last_n is None:
        return prompt, topk
    cut = prompt_length - last_n
    if prompt is not None:
        prompt = [None if i < cut else v for i, v in enumerate(prompt)]
    if topk is not None:
        topk = [None if i < cut else row for i, row in enumerate(topk)]
    return prompt, topk


def check_last_n(last_n: int | None, prompt_logprobs: bool, prompt_length: int) -> None:
    if last_n is None:
        return
    if not prompt_logprobs:
        raise SamplingError("prompt_logprobs_last_n: goes with prompt_logprobs (true)")
    if not 1 <= last_n <= prompt_length - 1:
        raise SamplingError(
            f"prompt_logprobs_last_n: {last_n} is not in 1..len(prompt) - 1 = {prompt_length - 1}"
        )


@dataclass(frozen=True)
class PromptAsks:
    """What a sample call asks of its prompt beyond its log-probabilities and top-k, which the
    gateway answers from the first sample's: ``last_n`` cuts them, ``targets`` lays them out."""

    prompt_length: int
    last_n: int | None = None
    targets: PromptTargets | None = None


def generate_requests(
    request_id: str,
    sampler: SamplerRecord,
    prompt: list[int],
    num_samples: int,
    params: SamplingParams,
    prompt_logprobs: bool = False,
    topk_prompt: int = 0,
    topk_sample: int = 0,
    targets: PromptTargets | None = None,
    alt_tokens: int = 0,
) -> list[GenerateRequest]:
    """One token-level request per sample; with a seed, sample ``i`` draws with ``seed + i``
    (the same seed for all would give ``num_samples`` copies of one sequence). The prompt's
    log-probabilities, its top-k, its targets' and its alternative tokens, when asked, come
    with the first sample (the prompt is the same); each sample carries its own tokens'
    top-k."""
    if not 0 <= alt_tokens <= MAX_TOP_LOGPROBS:
        raise SamplingError(f"prompt_alt_tokens_k: {alt_tokens} is not in 0..{MAX_TOP_LOGPROBS}")
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
            prompt_target_ids=targets.packed if targets is not None and i == 0 else None,
            prompt_alt_tokens=alt_tokens if i == 0 else 0,
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
                        prompt_target_logprobs=chunk.prompt_target_logprobs,
                        prompt_alt_tokens=chunk.prompt_alt_tokens,
                    )
            raise OpenAIError(502, "the inference worker ended without an answer")
    raise AssertionError("unreachable: the retries return or raise")


async def run(
    gw: Gateway,
    futures: RecordTable[FutureRecord],
    request_id: str,
    requests: list[GenerateRequest],
    asks: PromptAsks | None = None,
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
        targets = first.prompt_target_logprobs if first else None
        alternatives = first.prompt_alt_tokens if first else None
        for sequence in sequences:
            sequence.prompt_logprobs = None  # the outcome's, once
            sequence.topk_prompt_logprobs = None
            sequence.prompt_target_logprobs = None
            sequence.prompt_alt_tokens = None
        asks = asks or PromptAsks(prompt_length=len(requests[0].prompt_tokens or ()))
        prompt, topk_prompt = last_n_only(asks.prompt_length, asks.last_n, prompt, topk_prompt)
        # A worker that does not know the fields ignores them: fail, rather than answer less.
        if asks.targets is not None and targets is None:
            raise OpenAIError(502, "the inference worker answered no target_prompt_logprobs")
        if requests[0].prompt_alt_tokens and alternatives is None:
            raise OpenAIError(502, "the inference worker answered no prompt_alt_tokens")
        outcome = SampleOutcome(
            sequences=list(sequences),
            prompt_logprobs=prompt,
            topk_prompt_logprobs=topk_prompt,
            target_prompt_logprobs=(
                asks.targets.answer(targets)
                if asks.targets is not None and targets is not None
                else None
            ),
            prompt_alt_tokens=alternatives,
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

"""``/api/v1/*``, sampling: the Tinker SDK's sampling clients (docs/tinker.md, "Sampling").

A sampling session (``create_sampling_session``) names a base model or the weights that
``save_weights_for_sampler`` registered; ``asample`` answers a future at once and generates on
the inference workers (``swarm_gateway.tinker.sampling``); ``retrieve_future`` answers the
SDK's protobuf ``SampleResponse``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import Field, ValidationError

from swarm_contracts.inference import MAX_TOP_LOGPROBS, GenerateRequest
from swarm_gateway.routes.tinker import (
    GW,
    Lenient,
    T,
    Tables,
    Tenant,
    base_model_of,
    model_of,
    parse_path,
    session_of,
)
from swarm_gateway.state import Gateway
from swarm_gateway.tinker import sampling, sessions
from swarm_gateway.tinker.records import FutureRecord, SamplerRecord, model_token

router = APIRouter(prefix="/api/v1", tags=["tinker"])

_SAMPLER_ID = re.compile(r"^tsess-[0-9a-f]{16}:sample:[0-9]{1,9}$")
MAX_SAMPLES = 128
# A sample's request is kept in its future, for a gateway that adopts it to run it again, up
# to this size (a long prompt's targets are larger: such a sample fails with its gateway).
RESAMPLE_KEPT_BYTES = 256 * 1024


class CreateSamplerBody(Lenient):
    session_id: str
    sampling_session_seq_id: int = Field(ge=0, le=999_999_999)
    base_model: str | None = Field(default=None, min_length=1, max_length=256)
    model_path: str | None = Field(default=None, min_length=1, max_length=512)


@router.post("/create_sampling_session")
async def create_sampling_session(
    body: CreateSamplerBody, gw: GW, t: T, tenant: Tenant
) -> dict[str, str]:
    await session_of(t, tenant, body.session_id)
    sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
    record = await _target(gw, t, tenant, body.model_path, body.base_model)
    record.sampler_id, record.session_id = sampler_id, body.session_id
    await t.samplers.put(model_token(sampler_id), record)
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


class JoinBody(Lenient):
    sampling_session_id: str


@router.post("/join_sampling_session")
async def join_sampling_session(body: JoinBody, t: T, tenant: Tenant) -> dict[str, Any]:
    """A new client of the session (a sampling client sent to another process): its id."""
    await _sampler(t, tenant, body.sampling_session_id)

    def join(r: SamplerRecord) -> SamplerRecord:
        r.clients += 1
        return r

    written = await t.samplers.modify(model_token(body.sampling_session_id), join)
    assert written is not None
    return {"type": "join_sampling_session", "client_counter": written[0].clients - 1}


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, t: T, tenant: Tenant) -> dict[str, Any]:
    record = await _sampler(t, tenant, sampler_id)
    return {
        "sampler_id": record.sampler_id,
        "base_model": record.base_model_name,
        "model_path": record.model_path,
    }


class PromptBody(Lenient):
    chunks: list[dict[str, Any]] = Field(min_length=1)


class SampleBody(Lenient):
    num_samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    prompt: PromptBody
    sampling_params: sampling.SamplingParams = Field(default_factory=sampling.SamplingParams)
    sampling_session_id: str | None = None
    seq_id: int | None = None
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None


@router.post("/asample")
async def asample(body: SampleBody, gw: GW, t: T, tenant: Tenant) -> dict[str, Any]:
    request_id = t.calls.new_id()
    requests, asks, sampler = await _prepare(gw, t, tenant, body, request_id)
    kept = body.model_dump_json(exclude_defaults=True)
    future = FutureRecord(
        request_id=request_id,
        tenant=tenant,
        model_id=sampler.sampler_id or sampler.model_path or sampler.base_model_name,
        op="sample",
        deadline=time.time() + sessions.CALL_TIMEOUT_S,
        gateway=t.calls.inbox,
        resample=kept if len(kept) <= RESAMPLE_KEPT_BYTES else None,
    )
    await t.futures.put(request_id, future)
    t.calls.expect(request_id)
    _start(t, request_id, requests, gw, asks)
    return {
        "request_id": request_id,
        "sample_sequence_ids": [f"{request_id}-{i}" for i in range(body.num_samples)],
    }


async def resample(gw: Gateway, t: Tables, future: FutureRecord) -> None:
    """A sample whose gateway died before it finished, run again here (the gateway that adopted
    it): the client's future is answered as if nothing happened. Its generation requests get
    new ids (the dead gateway's may still be running on the inference workers)."""
    assert future.resample is not None
    body = SampleBody.model_validate_json(future.resample)
    try:
        requests, asks, _ = await _prepare(gw, t, future.tenant, body, t.calls.new_id())
    except HTTPException as exc:  # its sampler gone meanwhile, say
        await sessions.fail(t.calls, future, f"sampling again: {exc.detail}", "user")
        return
    t.calls.expect(future.request_id)
    _start(t, future.request_id, requests, gw, asks)


async def _prepare(
    gw: Gateway, t: Tables, tenant: str, body: SampleBody, generation_id: str
) -> tuple[list[GenerateRequest], sampling.PromptAsks, SamplerRecord]:
    """The inference requests of a sample (a 4xx for what is wrong in ``body``), what the
    answer must hold, and what it samples from."""
    _check_top_k(body)
    prompt = _prompt_tokens(body.prompt)
    try:
        sampling.check_last_n(body.prompt_logprobs_last_n, bool(body.prompt_logprobs), len(prompt))
        targets = (
            None
            if body.target_prompt_logprobs is None
            else sampling.PromptTargets.parse(body.target_prompt_logprobs, len(prompt))
        )
    except sampling.SamplingError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=str(exc)) from exc
    if body.sampling_session_id is not None:
        sampler = await _sampler(t, tenant, body.sampling_session_id)
    else:
        sampler = await _target(gw, t, tenant, body.model_path, body.base_model)
    try:
        requests = sampling.generate_requests(
            generation_id,
            sampler,
            prompt,
            body.num_samples,
            body.sampling_params,
            prompt_logprobs=bool(body.prompt_logprobs),
            topk_prompt=body.topk_prompt_logprobs,
            topk_sample=body.topk_sample_logprobs,
            targets=targets,
            alt_tokens=body.prompt_alt_tokens_k,
        )
    except (sampling.SamplingError, ValidationError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=_why(exc)) from exc
    return requests, sampling.PromptAsks(len(prompt), body.prompt_logprobs_last_n, targets), sampler


def _start(
    t: Tables,
    request_id: str,
    requests: list[GenerateRequest],
    gw: Gateway,
    asks: sampling.PromptAsks,
) -> None:
    async def work() -> None:
        future = None
        try:
            future = await sampling.run(gw, t.futures, request_id, requests, asks)
        finally:
            t.calls.settled(request_id, future)

    task = asyncio.create_task(work())
    t.tasks.add(task)
    task.add_done_callback(t.tasks.discard)


def _check_top_k(body: SampleBody) -> None:
    """Top-k beyond what the engine serves: a 400 naming the field, rather than fewer."""
    for field, k in (
        ("topk_prompt_logprobs", body.topk_prompt_logprobs),
        ("topk_sample_logprobs", body.topk_sample_logprobs),
        ("prompt_alt_tokens_k", body.prompt_alt_tokens_k),
    ):
        if not 0 <= k <= MAX_TOP_LOGPROBS:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, detail=f"{field}: {k} is not in 0..{MAX_TOP_LOGPROBS}"
            )


def _prompt_tokens(prompt: PromptBody) -> list[int]:
    tokens: list[int] = []
    for i, chunk in enumerate(prompt.chunks):
        kind = chunk.get("type", "encoded_text")
        ids = chunk.get("tokens")
        if kind != "encoded_text" or not isinstance(ids, list):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail=f"prompt.chunks[{i}]: {kind} chunks are not served (encoded_text only)",
            )
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, detail=f"prompt.chunks[{i}].tokens: not token ids"
            )
        tokens.extend(ids)
    if not tokens:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="prompt: no tokens")
    return tokens


async def _target(
    gw: Gateway, t: Tables, tenant: str, model_path: str | None, base_model: str | None
) -> SamplerRecord:
    """What to sample from: the adapter a ``sampler_weights`` path was registered as, or a
    base model (by registry name or Hugging Face id)."""
    if model_path is not None:
        model_id, kind, name = parse_path(model_path)
        if kind != "sampler_weights":
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail="model_path: sample from a save_weights_for_sampler path "
                "(tinker://<model_id>/sampler_weights/<name>)",
            )
        model = await model_of(t, tenant, model_id, field="model_path")
        adapter = model.samplers.get(name)
        if adapter is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                detail=f"model_path: no weights saved for sampling as {name!r}",
            )
        return SamplerRecord.of_weights(model, adapter, model_path)
    if base_model is None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail="model_path: give model_path or base_model"
        )
    base = await base_model_of(gw, base_model)
    return SamplerRecord(
        sampler_id="",
        session_id="",
        tenant=tenant,
        base_model=base.name,
        base_model_version=base.version,
        base_model_name=base_model,
    )


async def _sampler(t: Tables, tenant: str, sampler_id: str) -> SamplerRecord:
    found = (
        await t.samplers.get(model_token(sampler_id)) if _SAMPLER_ID.fullmatch(sampler_id) else None
    )
    # Another tenant's sampler is no different from none.
    if found is None or found[0].tenant != tenant:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail="sampling_session_id: no such sampling session"
        )
    return found[0]


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        if where.startswith("prompt_tokens"):
            return f"prompt: {first['msg']}"
        return f"sampling_params.{where.replace('stop_tokens', 'stop')}: {first['msg']}"
    return str(exc)

"""The gateway's records of Tinker sessions, their training models, their samplers and their
futures (KV buckets ``tinker_sessions``, ``tinker_models``, ``tinker_samplers``,
``tinker_futures``: no other service reads them)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from swarm_contracts.inference import TokenLogprob
from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.sessions import CreateSession, Op, SessionResult


def model_token(model_id: str) -> str:
    """The Tinker model id (``<session>:train:<n>``) as a subject token and KV key."""
    return model_id.replace(":", "-")


class SessionRecord(BaseModel):
    session_id: str
    tenant: str
    tags: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)
    finished: str | None = Field(
        default=None, description="why the client finished it (success, errored, interrupted)"
    )
    finished_at: datetime | None = None


class SavedState(BaseModel):
    """A ``save_state``: its tinker:// path, where it is in the store, the optimizer's step."""

    path: str
    store_key: str
    step: int


class ModelRecord(BaseModel):
    """A training client's model: where it is held and what it is."""

    model_id: str
    session_id: str
    tenant: str
    worker_id: str = Field(description="empty while it waits for room on a worker")
    attempt: int = Field(default=1, description="its lease's attempt (each placement a new one)")
    base_model: ModelRef
    base_model_name: str = Field(description="as the client named it (registry name or HF id)")
    rank: int
    target_modules: list[str] = Field(default_factory=list)
    state: Literal["queued", "creating", "ready", "failed", "closed"] = "creating"
    error: str | None = None
    max_context: int | None = None
    samplers: dict[str, str] = Field(
        default_factory=dict,
        description="save_weights_for_sampler's names -> the adapter version registered (name@v)",
    )
    create: CreateSession | None = Field(
        default=None, description="what built it: a restore on another worker builds it again"
    )
    last_state: SavedState | None = Field(
        default=None, description="its latest save_state: what a restore starts from"
    )
    restored: str | None = Field(
        default=None, description="why and from what it was last restored on another worker"
    )
    created_at: datetime = Field(default_factory=utcnow)


class SamplerRecord(BaseModel):
    """A sampling session: what its samples come from (a base model, or an adapter version that
    ``save_weights_for_sampler`` registered), served by the inference workers."""

    sampler_id: str
    session_id: str
    tenant: str
    base_model: str = Field(description="registry name")
    base_model_version: int
    base_model_name: str = Field(description="as the client named it (registry name or HF id)")
    adapter: str | None = Field(default=None, description="name@version, None: the base model")
    model_path: str | None = None
    clients: int = Field(default=1, description="clients joined (join_sampling_session)")
    created_at: datetime = Field(default_factory=utcnow)

    @classmethod
    def of_weights(
        cls, model: ModelRecord, adapter: str, model_path: str | None, sampler_id: str = ""
    ) -> SamplerRecord:
        """A sampler of the weights ``model`` saved for sampling, registered as ``adapter``."""
        return cls(
            sampler_id=sampler_id,
            session_id=model.session_id,
            tenant=model.tenant,
            base_model=model.base_model.name,
            base_model_version=model.base_model.version,
            base_model_name=model.base_model_name,
            adapter=adapter,
            model_path=model_path,
        )


class SampledSequence(BaseModel):
    tokens: list[int]
    logprobs: list[float] | None = None
    stop_reason: Literal["stop", "length"]
    topk_logprobs: list[list[TokenLogprob]] | None = Field(
        default=None, description="each token's k most likely (id, logprob), when asked"
    )
    # On their way to the outcome only.
    prompt_logprobs: list[float | None] | None = None
    topk_prompt_logprobs: list[list[TokenLogprob] | None] | None = None
    prompt_target_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[list[TokenLogprob]] | None = None


class TensorOut(BaseModel):
    """A float32 tensor of the SDK's: dense (``values`` row-major), or sparse CSR (``values``
    of the listed cells, ``crow`` and ``col`` as the request's)."""

    shape: list[int]
    values: list[float]
    crow: list[int] | None = None
    col: list[int] | None = None


class SampleOutcome(BaseModel):
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = Field(
        default=None, description="each prompt token's (the first's is None), when asked"
    )
    topk_prompt_logprobs: list[list[TokenLogprob] | None] | None = Field(
        default=None, description="each prompt position's k most likely (the first: None)"
    )
    target_prompt_logprobs: TensorOut | None = Field(
        default=None, description="the request's target ids' log-probabilities, its layout"
    )
    prompt_alt_tokens: list[list[TokenLogprob]] | None = Field(
        default=None, description="each prompt position's (after the first) k drawn tokens"
    )


class FollowUp(BaseModel):
    """What a call's settlement does besides settling its future, done by whichever gateway
    hears the answer (swarm_gateway.tinker.follow_ups): ``built``, the model is ready;
    ``saved``, it is the model's latest state; ``registered``, the weights saved for sampling
    are a version of the model's adapter (and, with ``sampler_id``, a sampling session)."""

    kind: Literal["built", "saved", "registered"]
    store_key: str | None = Field(default=None, description="saved, registered: where")
    name: str | None = Field(default=None, description="registered: the sampler weights' name")
    job_id: str | None = Field(default=None, description="registered: the job id it stands as")
    sampler_id: str | None = Field(default=None, description="registered: the session it opens")


class FutureRecord(BaseModel):
    """One call's future: pending until the worker answers (or ``deadline``, epoch seconds,
    passes), then its result or error, kept so that a reconnecting client can fetch it."""

    request_id: str
    tenant: str
    model_id: str
    worker_id: str | None = Field(default=None, description="where the call was sent")
    attempt: int = Field(
        default=0, description="the lease attempt it was sent under: a reply from another is stale"
    )
    op: Op | Literal["sample"]
    state: Literal["pending", "done", "failed"] = "pending"
    deadline: float
    sent_at: float = Field(default_factory=time.time)
    done_at: float | None = None
    result: SessionResult | None = None
    sample: SampleOutcome | None = None
    path: str | None = Field(default=None, description="saves and loads: the tinker:// path")
    adapter: str | None = Field(
        default=None, description="save_weights_for_sampler: the version registered (name@v)"
    )
    sampling_session_id: str | None = Field(
        default=None, description="save_weights_for_sampler: the sampling session it opened"
    )
    error: str | None = None
    category: Literal["user", "server"] | None = None
    waiting: str | None = Field(
        default=None, description="a create waiting for room on a worker: why (the scheduler's)"
    )
    gateway: str | None = Field(
        default=None,
        description="the gateway that answers for it (its inbox): it sent the call, or asks for "
        "the model's room; another adopts the future when that one no longer answers",
    )
    seq_id: int = Field(default=0, description="the call's seq_id: an adopter asks for it again")
    follow_up: FollowUp | None = Field(
        default=None, description="what its settlement does besides (tinker.follow_ups)"
    )
    resample: str | None = Field(
        default=None, description="a sample: its request (JSON), for an adopter to run it again"
    )

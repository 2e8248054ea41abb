"""The gateway's records of Tinker sessions, their training models and their futures (KV buckets
``tinker_sessions``, ``tinker_models``, ``tinker_futures``: no other service reads them)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.sessions import Op, SessionResult


def model_token(model_id: str) -> str:
    """The Tinker model id (``<session>:train:<n>``) as a subject token and KV key."""
    return model_id.replace(":", "-")


class SessionRecord(BaseModel):
    session_id: str
    tenant: str
    tags: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)


class ModelRecord(BaseModel):
    """A training client's model: where it is held and what it is."""

    model_id: str
    session_id: str
    tenant: str
    worker_id: str
    base_model: ModelRef
    base_model_name: str = Field(description="as the client named it (registry name or HF id)")
    rank: int
    state: Literal["creating", "ready", "failed", "closed"] = "creating"
    error: str | None = None
    max_context: int | None = None
    created_at: datetime = Field(default_factory=utcnow)


class FutureRecord(BaseModel):
    """One call's future: pending until the worker answers (or ``deadline``, epoch seconds,
    passes), then its result or error, kept so that a reconnecting client can fetch it."""

    request_id: str
    tenant: str
    model_id: str
    op: Op
    state: Literal["pending", "done", "failed"] = "pending"
    deadline: float
    sent_at: float = Field(default_factory=time.time)
    done_at: float | None = None
    result: SessionResult | None = None
    path: str | None = Field(default=None, description="saves and loads: the tinker:// path")
    error: str | None = None
    category: Literal["user", "server"] | None = None

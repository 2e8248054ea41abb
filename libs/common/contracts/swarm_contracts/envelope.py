"""The CloudEvents 1.0 structured envelope every Swarm message travels in (contract)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from swarm_contracts.jobs import utcnow

T = TypeVar("T")


class CloudEvent(BaseModel, Generic[T]):
    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    source: str = Field(description="swarm/<service>")
    type: str = Field(description="swarm.job.<event>, swarm.worker.heartbeat, ...")
    time: datetime = Field(default_factory=utcnow)
    subject: str | None = Field(default=None, description="the job id for job events")
    datacontenttype: Literal["application/json"] = "application/json"
    data: T


def envelope(service: str, type_: str, data: BaseModel, subject: str | None = None) -> CloudEvent:
    # Parametrised by the payload's own class, so the envelope's schema names the payload.
    model: Any = CloudEvent[type(data)]  # type: ignore[misc]
    return model(source=f"swarm/{service}", type=type_, subject=subject, data=data)

"""Datasets: JSONL files uploaded through the gateway, content-addressed by the sha256 of the
decompressed JSONL (stored zstd-compressed: ``layout.dataset_key``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from swarm_contracts.jobs import utcnow

DatasetFormat = Literal["text", "prompt_completion", "chat"]


def dataset_id_for(sha256: str) -> str:
    return f"ds-{sha256[:24]}"


class DatasetInfo(BaseModel):
    """One KV entry per dataset in the ``datasets`` bucket, key ``<tenant>.<id>``."""

    id: str
    tenant: str
    name: str | None = None
    sha256: str
    store_key: str
    format: DatasetFormat
    examples: int
    bytes: int
    created_at: datetime = Field(default_factory=utcnow)

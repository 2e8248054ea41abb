"""Datasets: JSONL files uploaded through the gateway, content-addressed by the sha256 of the
decompressed JSONL (stored zstd-compressed: ``layout.dataset_key``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from swarm_contracts.jobs import utcnow

DatasetFormat = Literal[
    "text",
    "prompt_completion",
    "chat",
    # Preference pairs, for DPO: {"prompt", "chosen", "rejected"} as strings, the same with
    # chat messages, or OpenAI's {"input": {"messages"}, "preferred_output",
    # "non_preferred_output"}.
    "preference",
    "preference_chat",
    "preference_openai",
]
PREFERENCE_FORMATS: frozenset[str] = frozenset(
    {"preference", "preference_chat", "preference_openai"}
)


def method_takes(method: str, dataset_format: str) -> bool:
    """Whether a job of training method ``method`` (``sft``, ``dpo``) can train on a dataset
    of ``dataset_format``: DPO on preference pairs only, SFT on anything else."""
    return (dataset_format in PREFERENCE_FORMATS) == (method == "dpo")


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


class DatasetUpload(BaseModel):
    """An upload validated in the background (``POST /v1/datasets?background=true``): the
    ``dataset_uploads`` KV bucket, key ``<tenant>.<upload_id>``, the gateway's own. Progress is
    of the uploaded file's bytes (compressed, as sent); ``dataset`` once it is ready."""

    upload_id: str
    tenant: str
    name: str | None = None
    state: Literal["validating", "ready", "invalid"] = "validating"
    bytes_total: int
    bytes_checked: int = 0
    lines_checked: int = 0
    error: str | None = Field(default=None, description="invalid: why, naming the bad lines")
    bad_lines: list[int] = Field(
        default_factory=list, description="invalid: the first bad lines' numbers (1-based)"
    )
    dataset: DatasetInfo | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

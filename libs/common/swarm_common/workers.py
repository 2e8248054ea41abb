"""Worker heartbeats and job assignments (contract)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobSpec, ModelRef, ParentAdapter, utcnow


class Gpu(BaseModel):
    index: int
    name: str
    memory_bytes: int


class Resources(BaseModel):
    cpus: int
    memory_bytes: int
    gpus: list[Gpu] = Field(default_factory=list)


class RunningJob(BaseModel):
    job_id: str
    attempt: int
    step: int = 0


class Heartbeat(BaseModel):
    """``data`` of ``swarm.workers.<worker_id>.heartbeat``, sent every few seconds."""

    worker_id: str
    resources: Resources
    free: Resources
    running: list[RunningJob] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    time: datetime = Field(default_factory=utcnow)


class Assignment(BaseModel):
    """``data`` of ``swarm.workers.<worker_id>.assign``: run this attempt of this job."""

    job_id: str
    attempt: int
    tenant: str
    worker_id: str
    spec: JobSpec
    base_model: ModelRef
    dataset: DatasetInfo
    validation: DatasetInfo | None = None
    # Set when the job continues training an adapter (``spec.from_adapter``), pinned.
    parent: ParentAdapter | None = None
    # W3C traceparent of the placement span: the trainer's spans for this attempt are its children.
    trace_parent: str | None = None


class WorkerInfo(BaseModel):
    """The scheduler's view of a worker, kept in the ``workers`` KV bucket for the gateway."""

    worker_id: str
    state: str = Field(description="alive | lost")
    resources: Resources
    free: Resources
    running: list[RunningJob] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    last_heartbeat: datetime


def parse_labels(text: str) -> dict[str, str]:
    """``"provider=acme,region=eu"`` → ``{"provider": "acme", "region": "eu"}``.

    Blank items are skipped; an item without ``=`` is an error, because a silently dropped label
    would make jobs that require it wait for ever without saying why.
    """
    labels: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"worker label {item!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels

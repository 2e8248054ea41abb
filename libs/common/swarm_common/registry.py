"""Registry records and the request/reply messages of its NATS API."""

from __future__ import annotations

from datetime import datetime
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from swarm_common.jobs import LoraSpec, TrainingSpec, utcnow


class ModelVersion(BaseModel):
    name: str
    version: int
    store_key: str = Field(description="prefix of the HF from_pretrained directory")
    files: dict[str, str] = Field(description="file name -> sha256")
    digest: str = Field(description="sha256 over the sorted (name, sha256) pairs")
    architecture: str
    parameter_count: int
    tokenizer: bool
    created_at: datetime = Field(default_factory=utcnow)


class Lineage(BaseModel):
    tenant: str
    job_id: str
    attempt: int
    base_model: str
    base_model_version: int
    base_model_digest: str
    dataset: str
    dataset_digest: str
    validation_dataset: str | None = None
    validation_digest: str | None = None
    lora: LoraSpec
    training: TrainingSpec
    metrics: dict[str, float] = Field(default_factory=dict)
    eval_history: list[dict[str, float]] = Field(default_factory=list)
    best_step: int | None = None
    worker_id: str | None = None
    worker_ids: list[str] = Field(
        default_factory=list, description="every worker of the run (multi-worker jobs)"
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None
    parent: str | None = Field(
        default=None, description="the adapter training continued from, as name@version"
    )

    def base_model_mismatch(self, name: str, version: int | None = None) -> str | None:
        """``trained on <model>@<version>`` when training cannot continue from this adapter
        on base model ``name[@version]`` (a LoRA fits only the weights it was trained on);
        None when it can."""
        if self.base_model == name and version in (None, self.base_model_version):
            return None
        return f"trained on {self.base_model}@{self.base_model_version}"


class AdapterVersion(BaseModel):
    name: str
    version: int
    tenant: str
    store_key: str
    files: dict[str, str] = Field(description="file name -> sha256")
    lineage: Lineage
    created_at: datetime = Field(default_factory=utcnow)


# --- request/reply payloads ---------------------------------------------------------------


class RegisterModel(BaseModel):
    """Files already uploaded under ``store_key``; the registry hashes and inspects them."""

    name: str
    store_key: str


class GetModel(BaseModel):
    name: str
    version: int | None = None


class RegisterAdapter(BaseModel):
    """Sent by the trainer once the adapter files are under ``store_key`` (an output prefix).

    Idempotent per ``job_id``: a retry returns the version made the first time.
    """

    name: str
    store_key: str
    lineage: Lineage


class ListAdapters(BaseModel):
    name: str | None = None
    tenant: str | None = None
    base_model: str | None = Field(default=None, description="model name, or name@version")


class GetAdapter(BaseModel):
    """One version: by ``version``, by ``alias``, or the latest; ``name`` may also be a ref
    (``bot@3``, ``bot@production``), see ``parse_adapter_ref``."""

    name: str
    version: int | None = None
    alias: str | None = None
    tenant: str | None = None


def parse_adapter_ref(ref: str) -> tuple[str, int | None, str | None]:
    """``name`` -> (name, None, None); ``name@3`` -> (name, 3, None); ``name@prod`` -> alias."""
    name, sep, tail = ref.partition("@")
    if not sep:
        return name, None, None
    return (name, int(tail), None) if tail.isdigit() else (name, None, tail)


class AdapterKey(BaseModel):
    """One version, seen by ``tenant`` (None: internal callers, who see every tenant)."""

    name: str
    version: int
    tenant: str | None = None


class SetAlias(BaseModel):
    """Point ``alias`` of ``name`` at ``version`` (an alias is per tenant: the version's)."""

    name: str
    alias: str
    version: int
    tenant: str | None = None


class AliasTarget(BaseModel):
    name: str
    tenant: str
    alias: str
    version: int
    previous_version: int | None = None


class PromotionRule(BaseModel):
    """Move ``alias`` to each newly registered version whose ``metric`` beats the holder's."""

    name: str
    alias: str
    metric: str = "eval_loss"
    mode: Literal["min", "max"] = "min"
    tenant: str | None = None


class AdapterPromoted(BaseModel):
    """``swarm.adapters.<name>.promoted``: an alias moved, by a rule or by a caller."""

    name: str
    tenant: str
    alias: str
    version: int
    previous_version: int | None = None
    rule: PromotionRule | None = Field(default=None, description="None when moved by hand")
    metrics: dict[str, float] = Field(default_factory=dict, description="the new version's metrics")
    previous_metrics: dict[str, float] = Field(default_factory=dict)


class VerifyReport(BaseModel):
    name: str
    version: int
    store_key: str
    ok: bool
    corrupted: list[str] = Field(default_factory=list, description="sha256 does not match")
    missing: list[str] = Field(default_factory=list)


class RunGc(BaseModel):
    """``min_age_s`` spares unreferenced objects younger than that: an upload may be about to
    be registered. ``dry_run`` reports without deleting."""

    dry_run: bool = False
    min_age_s: float = 3600.0


class GcReport(BaseModel):
    """Store keys removed (or that would be, for a dry run)."""

    adapters: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    checkpoints: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)


class LineageNode(BaseModel):
    ref: str = Field(description="name@version")
    tenant: str
    job_id: str
    base_model: str = Field(description="name@version")
    base_model_digest: str
    dataset: str
    dataset_digest: str
    validation_dataset: str | None = None
    validation_digest: str | None = None
    parent: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: datetime


class LineageEdge(BaseModel):
    source: str
    target: str
    kind: Literal["parent", "base_model", "dataset", "validation"]


class LineageGraph(BaseModel):
    """A version, its ancestors (``adapters[0]`` is the version asked for), and their inputs."""

    root: str
    adapters: list[LineageNode]
    edges: list[LineageEdge]
    unresolved: list[str] = Field(
        default_factory=list, description="parents that are deleted or not visible"
    )


T = TypeVar("T")


class Reply(BaseModel, Generic[T]):
    """Every registry/telemetry reply: ``ok`` with a result, or an error a caller can show."""

    ok: bool
    error: str | None = None
    result: T | None = None


# --- merged export (answered by a trainer agent, which has torch) ----------------------------


class ExportAdapter(BaseModel):
    """Request on ``swarm.trainer.export``: merge a registered adapter into its base model."""

    name: str
    version: int = Field(ge=1)
    tenant: str


class ExportResult(BaseModel):
    store_key: str = Field(description="exports/<tenant>/<name>/<version>/, from_pretrained layout")
    files: dict[str, str] = Field(description="file name -> sha256")
    adapter: str = Field(description="name@version")
    base_model: str = Field(description="name@version")

"""Registry records and the request/reply messages of its NATS API (its actions:
``swarm_contracts.registry_api``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from swarm_contracts.jobs import (
    CHECKPOINT_REF_PATTERN,
    ForkPoint,
    JobSpec,
    LoraSpec,
    ModelRef,
    TrainingSpec,
    base_model_reference,
    utcnow,
)
from swarm_contracts.memory import ModelShape
from swarm_contracts.names import HF_ID_PATTERN
from swarm_contracts.replies import Action

# Reply moved to swarm_contracts.replies; re-exported for code written against this module.
from swarm_contracts.replies import Reply as Reply


class ModelVersion(BaseModel):
    name: str
    version: int
    store_key: str = Field(description="prefix of the HF from_pretrained directory")
    files: dict[str, str] = Field(description="file name -> sha256")
    digest: str = Field(description="sha256 over the sorted (name, sha256) pairs")
    architecture: str
    parameter_count: int
    tokenizer: bool
    hf_id: str | None = Field(
        default=None, description="the Hugging Face Hub id it was registered from, if any"
    )
    modules: list[str] = Field(
        default_factory=list,
        description="names of the modules with 2-D weights (q_proj, v_proj, ...): what LoRA "
        "target_modules may name; empty when not known (registered before this was recorded)",
    )
    created_at: datetime = Field(default_factory=utcnow)
    shape: ModelShape | None = Field(
        default=None,
        description="architecture numbers from config.json (for memory estimates); None when "
        "the config is not a decoder's",
    )

    @property
    def reference(self) -> str:
        """What an adapter's ``base_model_name_or_path`` names (``base_model_reference``)."""
        return base_model_reference(self.name, self.version, self.hf_id)


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
    forked_from: str | None = Field(
        default=None, description="the job checkpoint training started from, as JOB_ID@STEP"
    )

    def base_model_mismatch(self, name: str, version: int | None = None) -> str | None:
        """``trained on <model>@<version>`` when training cannot continue from this adapter
        on base model ``name[@version]`` (a LoRA fits only the weights it was trained on);
        None when it can."""
        if self.base_model == name and version in (None, self.base_model_version):
            return None
        return f"trained on {self.base_model}@{self.base_model_version}"


class Quarantine(BaseModel):
    """Why a version may not be served, aliased, continued from or be ``latest``: the
    verification of the job that made it failed (docs/providers.md, *Quarantined adapters*)."""

    reason: str
    job_id: str = Field(description="the job whose verification failed")
    since: datetime = Field(default_factory=utcnow)


class AdapterVersion(BaseModel):
    name: str
    version: int
    tenant: str
    store_key: str
    files: dict[str, str] = Field(description="file name -> sha256")
    lineage: Lineage
    created_at: datetime = Field(default_factory=utcnow)
    quarantine: Quarantine | None = Field(
        default=None,
        description="set while the version is quarantined (its job's verification failed); "
        "an admin clears it (`swarm adapters unquarantine`)",
    )


def continued_spec(spec: JobSpec, parent: AdapterVersion) -> JobSpec:
    """The spec a job that continues training ``parent`` runs with. A LoRA's shape (rank,
    scale, target modules) cannot change while training continues, so the parent's replaces
    the spec's; dropout only acts during training and quantization only on the base model's
    weights, so those stay the job's. (The scheduler writes the result into the job record, so
    what the job runs with is visible; the gateway's memory estimate uses it too.)"""
    lora = parent.lineage.lora.model_copy(
        update={"dropout": spec.lora.dropout, "quantize": spec.lora.quantize}
    )
    return spec.model_copy(update={"lora": lora})


# --- request/reply payloads ---------------------------------------------------------------


class RegisterModel(BaseModel):
    """Files already uploaded under ``store_key``; the registry hashes and inspects them."""

    name: str
    store_key: str
    hf_id: str | None = Field(
        default=None,
        pattern=HF_ID_PATTERN,
        description="the Hugging Face Hub id the files came from (kept on the first version)",
    )


class ListModels(BaseModel):
    """Every model version (no filters yet)."""


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
    # The attempt's token from its assignment: with a job record that has one, only the worker
    # that holds the attempt may register its result (swarm_contracts.providers).
    attempt_token: str | None = Field(default=None, repr=False)


class ListAdapters(BaseModel):
    name: str | None = None
    tenant: str | None = None
    base_model: str | None = Field(default=None, description="model name, or name@version")


class GetAdapter(BaseModel):
    """One version: by ``version``, by ``alias``, or the latest; ``name`` may also be a ref
    (``bot@3``, ``bot@production``), see ``swarm_contracts.refs.Ref``."""

    name: str
    version: int | None = None
    alias: str | None = None
    tenant: str | None = None
    include_quarantined: bool = Field(
        default=False,
        description="answer with a quarantined version too (to show it); without it one is "
        "refused (conflict), and the latest is the newest that is not quarantined",
    )


class ForkCheckpoint(BaseModel):
    """``swarm.registry.checkpoints.fork``: pin ``source`` (``JOB_ID@STEP``, a committed
    checkpoint of one of ``tenant``'s jobs) for job ``job_id`` to start from. The registry
    copies it into ``job_id``'s own checkpoints (``layout.fork_key``; the same answer again
    for a repeated request) and hashes the adapter files. ``dry_run``: only check that it
    could (the gateway, before submitting). Refused ``not_found`` for an unknown job or
    another tenant's, ``conflict`` for a step with no committed checkpoint (never made, or
    already pruned or collected)."""

    job_id: str | None = Field(
        default=None, pattern=r"^job-[0-9a-f]{8,64}$", description="required unless dry_run"
    )
    tenant: str
    source: str = Field(pattern=CHECKPOINT_REF_PATTERN)
    optimizer: bool = False
    dry_run: bool = False


class ForkSource(BaseModel):
    """The registry's answer to ``ForkCheckpoint``: the pinned checkpoint (on a dry run, the
    source's own directory and no hashes), and what the source job trained with: a fork runs
    on the same base model version with the same LoRA shape."""

    fork: ForkPoint
    base_model: ModelRef
    lora: LoraSpec


def forked_spec(spec: JobSpec, source_lora: LoraSpec) -> JobSpec:
    """The spec a job that starts from a checkpoint runs with: the source's LoRA shape (the
    checkpoint's weights have it), the job's own dropout and quantization, as for
    ``continued_spec``."""
    lora = source_lora.model_copy(
        update={"dropout": spec.lora.dropout, "quantize": spec.lora.quantize}
    )
    return spec.model_copy(update={"lora": lora})


class QuarantineJob(BaseModel):
    """``swarm.registry.adapters.quarantine`` (the scheduler, when a job's verification
    failed): quarantine the version the job made; answered with it, or ``not_found`` when the
    job made none."""

    job_id: str
    reason: str


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
    """Move ``alias`` to each newly registered version whose ``metric`` beats the holder's
    and, with a ``threshold``, reaches it (``exact_match`` >= 0.9: mode max, threshold 0.9)."""

    name: str
    alias: str
    metric: str = "eval_loss"
    mode: Literal["min", "max"] = "min"
    tenant: str | None = None
    threshold: float | None = Field(
        default=None, allow_inf_nan=False, description="max: at least this; min: at most this"
    )

    def reached(self, value: float) -> bool:
        if self.threshold is None:
            return True
        return value >= self.threshold if self.mode == "max" else value <= self.threshold


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
    # The trainer's token cache of datasets that are gone (``layout.tokens_of_dataset``).
    tokens: list[str] = Field(default_factory=list)


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
    forked_from: str | None = Field(default=None, description="JOB_ID@STEP")
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: datetime


class LineageEdge(BaseModel):
    source: str
    target: str
    kind: Literal["parent", "checkpoint", "base_model", "dataset", "validation"]


class LineageGraph(BaseModel):
    """A version, its ancestors (``adapters[0]`` is the version asked for), and their inputs."""

    root: str
    adapters: list[LineageNode]
    edges: list[LineageEdge]
    unresolved: list[str] = Field(
        default_factory=list, description="parents that are deleted or not visible"
    )


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


EXPORT_ADAPTER = Action("export", ExportAdapter, ExportResult)
"""Asked on ``swarm.trainer.export`` (``Subjects.trainer``): any trainer agent may answer."""

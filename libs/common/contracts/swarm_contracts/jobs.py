"""The job spec a user submits and the job record the scheduler keeps (contract)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm_contracts.evals import DATASET_ID_PATTERN as DATASET_ID_PATTERN
from swarm_contracts.evals import EvalResult, EvalSpec
from swarm_contracts.memory import MemoryEstimate
from swarm_contracts.methods import SftMethod, TrainingMethod

# The one naming rule (swarm_contracts.names), re-exported for code written against this module.
from swarm_contracts.names import NAME_PATTERN as NAME_PATTERN
from swarm_contracts.verification import Verification, VerifyTarget

MODEL_REF_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}(@[0-9]+)?$"
# ``name@version``, or ``name@alias`` (resolved to a version when the job is submitted).
ADAPTER_REF_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}@[a-z0-9][a-z0-9_-]{0,62}$"
# ``JOB_ID@STEP``: a committed checkpoint of a job (what ``from_checkpoint`` names).
CHECKPOINT_REF_PATTERN = r"^job-[0-9a-f]{8,64}@[0-9]{1,9}$"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Strict(BaseModel):
    """Unknown fields are an error: a typo in a spec must not be silently ignored. NaN and
    infinity are no numbers a spec can mean."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


ModuleNames = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


class LoraSpec(Strict):
    r: int = Field(default=8, ge=1, le=256)
    alpha: float = Field(default=16.0, gt=0, le=1024)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    # The length limits are in the schema (not a validator), so that the OpenAPI document
    # refuses exactly what the validation refuses.
    target_modules: ModuleNames | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="module names (at least one), or 'all-linear'",
    )
    # QLoRA: the base model's decoder weights in 4-bit NF4 (bitsandbytes, CUDA only), compute
    # in bf16. The adapter trained is an ordinary one: it loads on the unquantized base.
    quantize: Literal["nf4"] | None = None


class TrainingSpec(Strict):
    max_steps: int = Field(default=200, ge=1, le=1_000_000)
    batch_size: int = Field(default=8, ge=1, le=4096)
    grad_accum: int = Field(default=1, ge=1, le=1024)
    lr: float = Field(default=2e-4, gt=0, le=1.0)
    warmup_steps: int = Field(default=10, ge=0)
    seq_len: int = Field(default=256, ge=8, le=131072)
    seed: int = Field(default=0, ge=0)
    eval_every: int = Field(default=50, ge=1)
    checkpoint_every: int = Field(default=50, ge=1)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    max_grad_norm: float = Field(default=1.0, gt=0)
    # Fraction of the training set held out for validation when no validation set is given.
    val_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    # Several examples per row (no padding waste; attention never crosses examples).
    packing: bool = False
    # Recompute activations in the backward pass: less memory, about a third more compute.
    gradient_checkpointing: bool = False
    # Attention over packed rows: "auto" picks per device (flash_attention_2 varlen where
    # installed on CUDA, else flex_attention; per-example sdpa spans on CPU); "sdpa" is the
    # fallback that builds a dense block-diagonal mask.
    attention: Literal["auto", "flash_attention_2", "flex_attention", "sdpa_varlen", "sdpa"] = (
        "auto"
    )
    # Liger Kernel's fused RMSNorm, RoPE, SwiGLU and linear + cross-entropy: "auto" uses them on
    # CUDA where the worker has liger_kernel installed.
    liger: Literal["auto", "on", "off"] = "auto"


class ResourceSpec(Strict):
    workers: int = Field(default=1, ge=1, le=256)
    gpus_per_worker: int = Field(default=0, ge=0, le=16)
    cpus_per_worker: int = Field(default=1, ge=1, le=256)
    # Each GPU the job gets must have at least this much memory (0: any GPU).
    min_gpu_memory_gb: float = Field(default=0.0, ge=0.0, le=4096.0)
    # Worker labels that must all match exactly (e.g. {"region": "eu"}); empty: any worker.
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    # How the model is spread over the workers: ddp (a full copy on each, gradients averaged)
    # or fsdp (parameters sharded across them: for base models bigger than one GPU).
    strategy: Literal["ddp", "fsdp"] = "ddp"


class JobSpec(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="adapter name in the registry")
    base_model: str = Field(pattern=MODEL_REF_PATTERN, description="registry model name[@version]")
    dataset: str = Field(pattern=DATASET_ID_PATTERN, description="dataset id from /v1/datasets")
    validation: str | None = Field(default=None, pattern=DATASET_ID_PATTERN)
    from_adapter: str | None = Field(
        default=None,
        pattern=ADAPTER_REF_PATTERN,
        description="continue training this adapter of the tenant's: name@version or name@alias",
    )
    from_checkpoint: str | None = Field(
        default=None,
        pattern=CHECKPOINT_REF_PATTERN,
        description="start from another job's committed checkpoint, JOB_ID@STEP (a fork): its "
        "adapter weights, and with from_checkpoint_optimizer its whole training state",
    )
    from_checkpoint_optimizer: bool = Field(
        default=False,
        description="with from_checkpoint: also take the checkpoint's optimizer state, LR "
        "schedule, step, data position and RNG, so the job continues that run from the step",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    # sft (default) or dpo, with the method's own settings (swarm_contracts.methods).
    method: TrainingMethod = Field(default_factory=SftMethod)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    priority: int = Field(default=5, ge=0, le=10)
    # Task evals: generate on held-out prompts and grade the outputs (swarm_contracts.evals).
    evals: EvalSpec | None = None

    @model_validator(mode="after")
    def _one_starting_point(self) -> JobSpec:
        # A job starts from a registered adapter or from a checkpoint, not both: each sets the
        # starting weights (and the LoRA shape).
        if self.from_adapter is not None and self.from_checkpoint is not None:
            raise ValueError("from_adapter and from_checkpoint exclude each other: give one")
        if self.from_checkpoint_optimizer and self.from_checkpoint is None:
            raise ValueError("from_checkpoint_optimizer needs from_checkpoint")
        return self


class SweepRef(Strict):
    """The sweep a job is a trial of (set by the sweeps controller)."""

    id: str = Field(pattern=r"^sweep-[0-9a-f]{8,64}$")
    trial: int = Field(ge=0)


class JobSubmission(Strict):
    """The ``data`` of a message on ``swarm.jobs.submit``."""

    spec: JobSpec
    tenant: str = Field(default="default", pattern=NAME_PATTERN)
    # Optional: the gateway sets it; plain NATS clients may leave it out, and the scheduler
    # derives it from the idempotency key so that duplicates map onto one job.
    job_id: str | None = Field(default=None, pattern=r"^job-[0-9a-f]{8,64}$")
    # Optional: the job is trial ``trial`` of this sweep; kept on the job record.
    sweep: SweepRef | None = None


def job_id_for(tenant: str, idempotency_key: str) -> str:
    """A job id that is a pure function of who asked and their idempotency key."""
    return "job-" + hashlib.sha256(f"{tenant}\x00{idempotency_key}".encode()).hexdigest()[:20]


def replay_job_id(tenant: str, job_id: str, attempt: int) -> str:
    """The replay job verifying ``job_id``'s attempt: one per attempt, however often asked."""
    return job_id_for(tenant, f"verify\x00{job_id}\x00{attempt}")


class JobState(StrEnum):
    queued = "queued"
    assigned = "assigned"
    running = "running"
    # Checkpointed and handed back on request (``swarm jobs pause``): no worker, no lease, no
    # capacity held, until a resume queues it again from that checkpoint.
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.succeeded, JobState.failed, JobState.cancelled)


def base_model_reference(name: str, version: int, hf_id: str | None = None) -> str:
    """How a registered adapter names its base model (``base_model_name_or_path`` in its
    ``adapter_config.json``): the Hugging Face Hub id the base model was registered from, which
    stock ``AutoPeftModelForCausalLM.from_pretrained`` resolves by itself; else the registry's
    ``name@version``, which ``swarm adapters pull NAME --with-base`` resolves to a local copy."""
    return hf_id or f"{name}@{version}"


class ModelRef(BaseModel):
    """A base model version pinned at submission, so a job never drifts to a newer one."""

    name: str
    version: int
    store_key: str
    digest: str
    hf_id: str | None = None

    @property
    def reference(self) -> str:
        return base_model_reference(self.name, self.version, self.hf_id)


class AdapterRef(BaseModel):
    name: str
    version: int
    store_key: str


class ParentAdapter(BaseModel):
    """The adapter a job continues training from (``from_adapter``), pinned at submission."""

    name: str
    version: int
    store_key: str
    files: dict[str, str] = Field(description="file name -> sha256, checked on download")

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


class ForkPoint(BaseModel):
    """The checkpoint a job starts from (``from_checkpoint``), pinned at submission: the
    registry copied the committed checkpoint into the job's own checkpoints
    (``layout.fork_key``), so that the source's retention cannot take it away, and recorded
    the sha256 of the adapter files the trainer loads from it."""

    job_id: str = Field(description="the job the checkpoint is of")
    attempt: int = Field(description="the attempt whose run committed it")
    step: int
    store_key: str = Field(description="the copy: a checkpoint directory")
    files: dict[str, str] = Field(
        default_factory=dict, description="adapter file name -> sha256, checked on download"
    )
    optimizer: bool = Field(
        default=False, description="the job continues the run (optimizer, schedule, step, data)"
    )

    @property
    def ref(self) -> str:
        return f"{self.job_id}@{self.step}"


def parse_checkpoint_ref(ref: str) -> tuple[str, int]:
    """``JOB_ID@STEP`` -> (job id, step); ValueError when it is not one."""
    job_id, sep, step = ref.partition("@")
    if not sep or not job_id.startswith("job-") or not step.isdigit():
        raise ValueError(f"{ref!r} is not JOB_ID@STEP")
    return job_id, int(step)


class JobRecord(BaseModel):
    """The scheduler's record of a job, one KV entry per job; changed only by compare-and-set."""

    job_id: str
    tenant: str
    spec: JobSpec
    state: JobState = JobState.queued
    attempt: int = 0
    # How many of those attempts failed (the worker lost, restarted or silent past its lease,
    # or at fault): what ``SWARM_MAX_ATTEMPTS`` bounds. A hand-back (drain, shutdown) takes a
    # new attempt number but counts nothing. Records written before this field read as 0.
    faults: int = 0
    worker_id: str | None = None
    reason: str | None = None
    base_model: ModelRef | None = None
    parent: ParentAdapter | None = None
    # Set when the job starts from another job's checkpoint (``spec.from_checkpoint``), pinned.
    fork: ForkPoint | None = None
    adapter: AdapterRef | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    # The latest task evaluation (``evals``): its metrics are in ``metrics`` too.
    evals: EvalResult | None = None
    cancel_requested: bool = False
    # A pause was asked while a worker held the job: the worker checkpoints and hands it back,
    # and the hand-back leaves it ``paused`` rather than queued.
    pause_requested: bool = False
    pause_requested_at: datetime | None = None
    # Lease bookkeeping in the record, not in a scheduler's memory, so that a new leader
    # times out an unconfirmed assignment or an unanswered cancel from the same clock.
    assigned_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    # W3C traceparent of the span that accepted the job: the job's one trace continues from it
    # whenever the job is picked up again (placement, requeue), however much later.
    trace_parent: str | None = None
    # The sweep this job is a trial of, if any.
    sweep: SweepRef | None = None
    # sha256 of the current attempt's token (``Assignment.attempt_token``): the scheduler
    # applies a worker's event only when it carries that token.
    attempt_token_sha256: str | None = None
    # The GPU memory the job is estimated to need per GPU (set at submission when the registry
    # knows the base model's architecture): a GPU job is placed only on GPUs at least this big.
    memory: MemoryEstimate | None = None
    # The committed checkpoints of the current attempt that Ray still keeps (the last
    # ``layout.CHECKPOINTS_KEPT``, ascending): where a replay of it can start and end.
    checkpoints: list[int] = Field(default_factory=list)
    # Set on a replay job (swarm_contracts.verification): the job, attempt and steps it replays.
    verify: VerifyTarget | None = None
    # Set on a replayed job: its replay and the outcome.
    verification: Verification | None = None
    # Attempts up to this one are not resumed from: a job rerun after its verification failed
    # starts again rather than continue from the checkpoints of the worker that failed it.
    resume_after_attempt: int = 0


def unverifiable(record: JobRecord) -> str | None:
    """Why the record's current attempt cannot be replayed (None: it can, or already is)."""
    if record.verify is not None:
        return "a replay is not verified in turn"
    if record.state != JobState.succeeded:
        return f"only a succeeded job can be verified; {record.job_id} is {record.state.value}"
    if len(set(record.checkpoints)) < 2:
        return (
            f"{record.job_id} has fewer than two committed checkpoints to replay between "
            "(training.checkpoint_every below max_steps gives two)"
        )
    return None


def unpausable(record: JobRecord) -> str | None:
    """Why the job cannot be paused now (None: it can, or a pause is already under way). Only
    a job a worker holds (assigned or running) is paused: it has a run to checkpoint and a
    worker to free. A queued job holds nothing (cancel it, or pause it once it runs)."""
    if record.verify is not None:
        return "a verification replay cannot be paused"
    if record.state == JobState.paused:
        return f"{record.job_id} is already paused"
    if record.state.terminal:
        return f"{record.job_id} has {record.state.value}: nothing to pause"
    if record.cancel_requested:
        return f"{record.job_id} is being cancelled"
    if record.state == JobState.queued:
        return (
            f"{record.job_id} is queued, not running: only a running job can be paused "
            "(cancel it, or pause it once it runs)"
        )
    return None


def unresumable(record: JobRecord) -> str | None:
    """Why the job cannot be resumed (None: it is paused)."""
    if record.state == JobState.paused:
        return None
    if record.pause_requested and not record.state.terminal:
        return f"{record.job_id} is still being paused: resume it once it is paused"
    return f"{record.job_id} is {record.state.value}, not paused: nothing to resume"

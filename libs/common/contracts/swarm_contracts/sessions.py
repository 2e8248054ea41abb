"""Training sessions (the Tinker-compatible API): what the gateway asks of the worker that holds
a session, and what the worker answers.

The gateway speaks the Tinker HTTP protocol to the client (docs/tinker.md) and turns each
training call into one ``SessionCall`` on ``swarm.workers.<worker>.sessions.<session>``
(request/reply); the worker runs the calls of a session one at a time, in ``seq_id`` order, and
answers ``Reply[SessionResult]``. A refusal with code ``invalid`` is the caller's mistake (the
SDK's ``user`` error category); anything else is the server's.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field

from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.names import NAME_PATTERN
from swarm_contracts.replies import Action

# A session's subject token and KV key: the Tinker model id with ':' made '-'
# (``<session>:train:<n>`` -> ``<session>-train-<n>``).
SESSION_TOKEN_PATTERN = r"^tsess-[0-9a-f]{16}-train-[0-9]{1,6}$"


def is_session(name: str) -> bool:
    """Whether a job id of an attempt query or a store-access request names a training
    session (its token, ``tsess-…-train-<n>``): its lease is the authority, not a job record."""
    return re.fullmatch(SESSION_TOKEN_PATTERN, name) is not None


# The loss functions a session computes (the SDK names more: they are refused, by name), and
# the loss_fn_config keys a loss cannot do without (no default of Tinker's is documented).
LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
REQUIRED_CONFIG = {"dro": ("beta",)}

# ``answer_again``: the worker's answer to the session's call ``seq_id`` (0: its create) once
# more, from the last answers it keeps: the gateway that sent the call died before it heard it.
Op = Literal[
    "create",
    "forward",
    "forward_backward",
    "optim_step",
    "save_state",
    "load_state",
    "save_weights_for_sampler",
    "close",
    "answer_again",
]


class SessionDatum(BaseModel):
    """One Tinker ``Datum``: the input tokens and the loss function's inputs, flattened
    (``target_tokens`` as numbers, ``weights``, ``logprobs``, ``advantages``: one per token)."""

    tokens: list[int] = Field(min_length=1)
    inputs: dict[str, list[float]] = Field(default_factory=dict)


class AdamStep(BaseModel):
    """Tinker's ``AdamParams``: the optimizer's settings for this step."""

    learning_rate: float = Field(default=1e-4, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-12, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    grad_clip_norm: float = Field(default=0.0, ge=0.0)


# The modules a session's LoRA adapts (Tinker's train_attn and train_mlp).
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


class CreateSession(BaseModel):
    base_model: ModelRef
    rank: int = Field(ge=1, le=256)
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    load_key: str | None = Field(
        default=None, description="start from this save_state (create_training_client_from_state)"
    )
    load_optimizer: bool = Field(default=False, description="with load_key: its optimizer too")

    @property
    def target_modules(self) -> list[str]:
        attention = ATTENTION_MODULES if self.train_attn else ()
        return [*attention, *(MLP_MODULES if self.train_mlp else ())]


class SessionCall(BaseModel):
    session: str = Field(pattern=SESSION_TOKEN_PATTERN)
    tenant: str = Field(pattern=NAME_PATTERN)
    seq_id: int = Field(ge=0, description="the SDK's order of the session's calls (create: 0)")
    attempt: int = Field(
        default=1,
        ge=1,
        description="the lease's attempt (SessionLease): a worker holding "
        "another attempt of the session refuses the call",
    )
    op: Op
    create: CreateSession | None = None
    data: list[SessionDatum] = Field(default_factory=list)
    loss_fn: str | None = None
    loss_fn_config: dict[str, float] = Field(default_factory=dict)
    adam: AdamStep | None = None
    store_key: str | None = Field(
        default=None, description="save_state/load_state/save_weights_for_sampler: where"
    )
    optimizer: bool = Field(default=True, description="load_state: the optimizer's state too")
    attempt_token: str | None = Field(
        default=None,
        repr=False,
        description="create: the lease attempt's token (its digest is in the SessionLease), with "
        "which a worker holding no store keys asks the registry for the session's store access",
    )


class SessionResult(BaseModel):
    """Per datum, the loss function's outputs (``logprobs``, ``elementwise_loss``: one per
    token); ``metrics`` (``loss:sum``, ...); ``store_key`` for saves; ``step``: optimizer steps
    taken so far."""

    outputs: list[dict[str, list[float]]] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    store_key: str | None = None
    files: dict[str, str] = Field(default_factory=dict, description="saved file -> sha256")
    step: int = 0
    model_info: dict[str, str | int | None] = Field(default_factory=dict)
    compute_s: float | None = Field(
        default=None, description="how long the worker ran the call (not waiting for its turn)"
    )


# --- placement: the scheduler leases a worker's room to a session, as to a job ---------------


class PlaceSession(BaseModel):
    """``swarm.scheduler.sessions.place`` (gateway -> scheduler): lease room for the session on
    a worker, other than ``avoid`` (the worker it was lost with: its lease ends)."""

    session: str = Field(pattern=SESSION_TOKEN_PATTERN)
    tenant: str = Field(pattern=NAME_PATTERN)
    base_model: ModelRef
    avoid: str | None = None
    attempt_token_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the digest of the token the gateway gives the worker with the create call "
        "(the token itself never reaches the scheduler or a bucket)",
    )
    waiting_since: AwareDatetime | None = Field(
        default=None,
        description="when the model first asked for room, for a wait another gateway adopted "
        "(its gateway died): it keeps its place in the fair order",
    )


class ReleaseSession(BaseModel):
    """``swarm.scheduler.sessions.release``: the session's lease (this attempt of it) ends."""

    session: str = Field(pattern=SESSION_TOKEN_PATTERN)
    attempt: int = Field(ge=1)
    reason: str = Field(default="closed", max_length=500)


class SessionLease(BaseModel):
    """A session's room on a worker (KV bucket ``session_leases``, written by the scheduler):
    it counts against the worker's capacity (``cpus``/``gpus``: the worker's session lane,
    which its sessions share) and its tenant's running work like a job's assignment, is renewed
    by the worker's heartbeats listing it (``HeldSession``), and each placement of the session
    is a new ``attempt``, the fencing token its calls carry."""

    session: str = Field(pattern=SESSION_TOKEN_PATTERN)
    tenant: str = Field(pattern=NAME_PATTERN)
    worker_id: str
    attempt: int = Field(ge=1)
    cpus: int = Field(ge=0)
    gpus: int = Field(ge=0)
    base_model: ModelRef | None = Field(
        default=None, description="what the session trains (its store access reads it)"
    )
    attempt_token_sha256: str | None = Field(
        default=None, description="PlaceSession's: the registry grants store access with it"
    )
    state: Literal["held", "ended"] = "held"
    reason: str | None = Field(default=None, description="why it ended")
    granted_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None


class HeldSession(BaseModel):
    """A session a worker holds (or is building), listed in its heartbeats."""

    session: str
    attempt: int


PLACE_SESSION = Action("sessions.place", PlaceSession, SessionLease)
RELEASE_SESSION = Action("sessions.release", ReleaseSession, SessionLease)

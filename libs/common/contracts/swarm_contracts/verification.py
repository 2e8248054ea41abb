"""Verification of untrusted work: a second worker replays a step range of a finished job from
its committed checkpoints and compares (docs/providers.md, *Verification of untrusted work*).

The replay is a job of its own (a ``JobRecord`` whose ``verify`` names the target), placed,
leased, fenced and cancelled like any other; its worker reports a ``ReplayReport`` in its
terminal ``replayed`` event, and the scheduler judges it against the target's own reports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

VerificationOutcome = Literal["pending", "passed", "failed", "error"]
# What the scheduler does to a job whose replay did not match (SWARM_VERIFY_POLICY).
VerifyPolicy = Literal["fail", "rerun"]


class VerifyTarget(BaseModel):
    """What a replay job replays: steps ``from_step`` + 1 … ``to_step`` of ``job_id``'s attempt
    ``attempt``, which ``worker_id`` trained, from its committed checkpoint at ``from_step``,
    compared with its committed checkpoint at ``to_step``."""

    job_id: str
    attempt: int = Field(ge=1)
    worker_id: str
    provider: str | None = Field(
        default=None, description="the trainer's provider (or provider label), also excluded"
    )
    from_step: int = Field(ge=0)
    to_step: int = Field(ge=1)

    @model_validator(mode="after")
    def _a_range(self) -> VerifyTarget:
        if self.from_step >= self.to_step:
            raise ValueError("from_step must be below to_step")
        return self

    @property
    def steps(self) -> int:
        return self.to_step - self.from_step


class Verification(BaseModel):
    """On the target's record: its replay and how it came out."""

    replay_job_id: str
    attempt: int = Field(description="the target attempt replayed")
    from_step: int
    to_step: int
    outcome: VerificationOutcome = "pending"
    reason: str | None = None


class VerifyRequest(BaseModel):
    """``data`` of a message on ``swarm.jobs.<job_id>.verify``: replay part of this finished
    job on another worker now (the gateway's ``POST /v1/jobs/{id}/verify``)."""

    job_id: str


class ReplayReport(BaseModel):
    """What a replay measured: the relative L2 distance ``‖ours - theirs‖ / ‖theirs‖`` of each
    LoRA matrix at ``to_step``, and its own loss of every step it replayed."""

    from_step: int
    to_step: int
    distances: dict[str, float] = Field(description="LoRA matrix name -> relative L2 distance")
    missing: list[str] = Field(
        default_factory=list,
        description="matrices on one side only, or of another shape: no match whatever else",
    )
    losses: dict[int, float] = Field(description="step -> the replay's training loss")
    elapsed_s: float = 0.0

    @property
    def worst(self) -> tuple[str, float]:
        """The matrix farthest from the target's (name, distance); ("", 0.0) for none."""
        if not self.distances:
            return "", 0.0
        name = max(self.distances, key=lambda n: self.distances[n])
        return name, self.distances[name]

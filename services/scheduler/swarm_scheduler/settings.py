"""The scheduler's own settings (``SWARM_*``), beside the shared ones of ``swarm_runtime``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarm_runtime.settings import Settings


class SchedulerSettings(Settings):
    worker_timeout_s: float = 15.0
    max_attempts: int = 3
    # An assignment the trainer has not confirmed with `started` in this time, or a running job
    # its worker's heartbeats have stopped listing for this long, is requeued.
    assign_timeout_s: float = 60.0
    # A cancelled job its worker has not reported stopped (a worker reports within about 2 s,
    # even while Ray is still starting the run) is ended by the scheduler after this: a cancel
    # takes effect within about this plus a second from any state.
    cancel_grace_s: float = 4.0
    # A job paused while running whose worker has not handed it back (checkpointed and
    # stopped) within this long is taken back by the scheduler and paused from its last
    # committed checkpoint; the worker, no longer holding it, stops the run.
    pause_grace_s: float = Field(default=120.0, gt=0)
    # Whether Tinker training sessions may be placed on providers' workers (docs/tinker.md,
    # *Placement*). A session's store access is scoped to its tenant's saves like a job's, but
    # its work cannot be replayed to check it (each call is the client's): off by default, for
    # a cluster that trusts its providers with its users' interactive training.
    sessions_on_providers: bool = False
    # Most jobs one tenant may have assigned or running at once; 0 means no limit.
    tenant_max_running: int = Field(default=0, ge=0)
    # Among the workers a job fits: "best_fit" takes the one left with the least spare room
    # (equally fitting ones: the faster first), "fastest" the fastest by its self-benchmark
    # (equally fast ones: the best fit first). Workers without a benchmark count as slowest.
    placement_order: Literal["best_fit", "fastest"] = "best_fit"
    # A worker whose benchmark measures below this fraction of what it advertises (or its GPU
    # model's datasheet TFLOP/s) is flagged "slow".
    slow_fraction: float = Field(default=0.3, ge=0, le=1)
    # Verification of untrusted work (docs/providers.md): this fraction of succeeded jobs,
    # drawn at random once each has ended, is replayed in part on another worker.
    verify_fraction: float = Field(default=0.0, ge=0, le=1)
    # A replay that does not match marks the worker suspect, and fails the job ("fail") or
    # queues it again to train from the start elsewhere ("rerun").
    verify_policy: Literal["fail", "rerun"] = "fail"
    # Largest relative L2 distance of any LoRA matrix, and relative difference of any step's
    # loss, that still match. A replay runs the same spec (so the same device kind and
    # precision): fp32 on CPUs reproduces a run bit for bit; bf16 on GPU models with different
    # kernels drifts, which the 5 % margin leaves room for (a cheat smaller than that passes).
    verify_tolerance: float = Field(default=0.05, gt=0)
    verify_loss_tolerance: float = Field(default=0.05, gt=0)

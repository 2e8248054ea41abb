"""Points where tests look into the training loop or break it. A job runs with ``LoopHooks``,
which does nothing; tests pass one of the others through ``run_job(hooks=...)``.

They live in the package, not in the tests, because Ray unpickles them in its worker
processes, which import ``swarm_trainer`` but not the test modules. Ray's controller process
unpickles the loop config too, so this module imports no torch or peft at its top: what the
test hooks need they import when they run (in a worker, where it is loaded already).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from swarm_contracts.layout import join_key, run_key

if TYPE_CHECKING:
    import torch

    from swarm_contracts.jobs import TrainingSpec
    from swarm_contracts.workers import Assignment
    from swarm_runtime.store import ObjectStore
    from swarm_trainer.step import StepResult
    from swarm_trainer.train_state import TrainState


class Recipe(Protocol):
    """What a hook may read of a rank's run (``recipe.Recipe`` is one; a protocol, so that
    this module does not import the loop that calls it)."""

    job: Assignment
    rank: int
    store: ObjectStore
    peft_model: Any
    sharding: Any  # sharding.Replicated or .Sharded

    @property
    def training(self) -> TrainingSpec: ...


class LoopHooks:
    """Called on every rank; each does nothing here."""

    def before_step(self, recipe: Recipe, state: TrainState) -> None:
        """Before step ``state.step + 1`` (and before the cancel check)."""

    def after_step(self, recipe: Recipe, result: StepResult) -> None:
        """After each optimizer step."""

    def after_training(self, recipe: Recipe) -> None:
        """After the last step, before rank 0 saves the best adapter."""

    def before_checkpoint(self, recipe: Recipe, state: TrainState) -> None:
        """Before the checkpoint of step ``state.step`` is gathered and saved."""


@dataclass
class CrashBeforeStep(LoopHooks):
    """Rank 0's worker process dies once before ``step``, leaving a partial checkpoint
    directory for step - 1 as a crash in the middle of an upload would. ``marker`` (a local
    file) records the step it died after, and keeps the restarted run from dying again."""

    step: int
    marker: str

    def before_step(self, recipe: Recipe, state: TrainState) -> None:
        from swarm_trainer.checkpoint import ADAPTER_FILE, checkpoint_dir_name
        from swarm_trainer.resume_point import wait_committed

        done = state.step
        if recipe.rank != 0 or done + 1 != self.step or os.path.exists(self.marker):
            return
        job, store = recipe.job, recipe.store
        # Wait until the last checkpoint is committed, so the test knows which step resumes.
        last = done - done % recipe.training.checkpoint_every
        wait_committed(store, job.job_id, job.attempt, last)
        Path(self.marker).write_text(str(done))
        partial = join_key(run_key(job.job_id, job.attempt), checkpoint_dir_name(done))
        store.put_bytes(join_key(partial, ADAPTER_FILE), b"half-written")
        os._exit(1)


@dataclass
class RecordRanks(LoopHooks):
    """Each rank writes ``rank<N>.json`` into ``trace_dir``: the examples it trained on and a
    digest of its final adapter weights."""

    trace_dir: str
    sources: list[int] = field(default_factory=list)

    def after_step(self, recipe: Recipe, result: StepResult) -> None:
        self.sources += result.sources

    def after_training(self, recipe: Recipe) -> None:
        # A collective under fsdp: every rank calls it.
        weights = recipe.sharding.adapter_weights(recipe.peft_model)
        trace = {
            "rank": recipe.rank,
            "sources": self.sources,
            "adapter_digest": digest(weights),
        }
        Path(self.trace_dir, f"rank{recipe.rank}.json").write_text(json.dumps(trace))


@dataclass
class PerturbCheckpoints(LoopHooks):
    """A deliberately dishonest worker: before each checkpoint, every LoRA matrix gets noise of
    ``scale`` times its own norm (a worker passing off cheaper or made-up work as training).
    The noise stays in the model, so the run goes on from the perturbed weights, and its
    checkpoints and adapter are what such a worker would hand in."""

    scale: float = 0.5
    seed: int = 1234

    def before_checkpoint(self, recipe: Recipe, state: TrainState) -> None:
        import torch

        # Its own generator: the run's RNG streams (dropout, data order) stay untouched.
        generator = torch.Generator().manual_seed(self.seed + state.step)
        with torch.no_grad():
            for name, param in recipe.peft_model.named_parameters():
                if "lora_" not in name:
                    continue
                noise = torch.randn(param.shape, generator=generator).to(param.device, param.dtype)
                size = float(param.norm()) or 1e-3  # lora_B starts at zero
                param.add_(noise * (self.scale * size / float(noise.norm())))


@dataclass
class SlowSteps(LoopHooks):
    """Every step takes at least ``seconds`` longer: a slow worker, so that a test which
    watches a run from outside (the dashboard's live curve) sees it in the middle however
    fast the machine trains the tiny model."""

    seconds: float = 0.4

    def before_step(self, recipe: Recipe, state: TrainState) -> None:
        time.sleep(self.seconds)


@dataclass
class SlowNamedSteps(LoopHooks):
    """Every step of a job named ``slow-…`` takes at least ``seconds`` longer, other jobs'
    none: a test that must act on a run in its middle (pause it) gets a run that lasts,
    however fast the machine, from a few slow steps rather than from many steps of compute,
    on a worker the other tests share."""

    seconds: float = 0.2

    def before_step(self, recipe: Recipe, state: TrainState) -> None:
        if recipe.job.spec.name.startswith("slow-"):
            time.sleep(self.seconds)


@dataclass
class StallStart(LoopHooks):
    """Each run stalls ``seconds`` before its first step, where nothing polls the cancel flag
    yet: what Ray starting the run and the ranks loading the model cost on a loaded machine
    (tens of seconds), made long enough that only an abort from outside ends it sooner."""

    seconds: float = 300.0
    _stalled: bool = False

    def before_step(self, recipe: Recipe, state: TrainState) -> None:
        if not self._stalled:
            self._stalled = True
            time.sleep(self.seconds)


# The hooks an agent can be told to run every job with (``SWARM_TRAINER_TEST_HOOK``), so that
# a test can make a whole worker process misbehave.
AGENT_HOOKS: dict[str, type[LoopHooks]] = {
    "perturb_checkpoints": PerturbCheckpoints,
    "slow_steps": SlowSteps,
    "slow_named_steps": SlowNamedSteps,
    "stall_start": StallStart,
}


def agent_hooks(name: str) -> LoopHooks | None:
    """The named hook (None for ""); an unknown name is an error, not an honest worker."""
    if not name:
        return None
    if name not in AGENT_HOOKS:
        raise ValueError(f"unknown trainer test hook {name!r}; known: {', '.join(AGENT_HOOKS)}")
    return AGENT_HOOKS[name]()


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

"""What rank 0 tells the agent while a run goes on, through the agent's ``JobControl`` actor
(what a finished run measured goes through the store: ``train_state.TrainMetrics``).

The reports are advisory (the agent turns them into job events, spans and metrics; a dropped
one loses nothing): each is stamped with rank 0's wall clock (``at``) and, where work was
timed, how long it took (``step_s``, ``eval_s``, ``upload_s``, ``save_s``), so the agent can
place the phases in the job's trace as they ran. Consumers ``match`` on the type.

Standard library only: the queue's actor process unpickles them too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class _Report:
    at: float = field(default_factory=time.time)  # rank 0's wall clock when it was sent


@dataclass(frozen=True, kw_only=True)
class Started(_Report):
    """Rank 0 is set up (workers, model, data, resume) and starts stepping."""

    resumed_from_step: int
    # Which of "base_model", "dataset", "validation" rank 0 found in the machine's cache, and
    # how long getting them took (downloading the rest, verifying the cached ones).
    cached: tuple[str, ...] = ()
    fetch_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Progress(_Report):
    """One optimizer step done."""

    step: int
    max_steps: int
    loss: float
    lr: float
    tokens_per_s: float  # summed over ranks
    elapsed_s: float  # since training (this Ray run's) started
    step_s: float
    # The training method's measures of the step (DPO: rewards, ``PreferenceMetrics``'s
    # fields; SFT: none).
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Validated(_Report):
    step: int
    eval_loss: float
    perplexity: float
    eval_s: float
    # The task evals' ``EvalResult`` as JSON (the reports stay standard library only).
    evals: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # as ``Progress.metrics``


@dataclass(frozen=True, kw_only=True)
class CheckpointReported(_Report):
    """Every rank reported the checkpoint to Ray; Ray commits it asynchronously."""

    step: int
    dir_name: str
    upload_s: float


@dataclass(frozen=True, kw_only=True)
class Finished(_Report):
    """The best adapter and the run's ``TrainMetrics`` are in the store."""

    step: int
    save_s: float


@dataclass(frozen=True, kw_only=True)
class Cancelled(_Report):
    """Every rank stopped before ``step`` for a cancel; nothing is saved."""

    step: int


Report = Started | Progress | Validated | CheckpointReported | Finished | Cancelled


@dataclass(frozen=True)
class Evaluation:
    step: int
    eval_loss: float
    perplexity: float
    task: dict[str, float] = field(default_factory=dict)  # the task evals' metrics

    def figures(self) -> dict[str, float]:
        """Flat, as the adapter's lineage keeps each evaluation: step, losses, task metrics."""
        figures = {"step": self.step, "eval_loss": self.eval_loss, "perplexity": self.perplexity}
        return {**figures, **self.task}

    def better_than(self, other: Evaluation, select_by: str | None) -> bool:
        """Lower eval loss; or, by a task metric, higher (ties: lower eval loss)."""
        if select_by is None or select_by not in self.task or select_by not in other.task:
            return self.eval_loss < other.eval_loss
        mine, theirs = self.task[select_by], other.task[select_by]
        return mine > theirs or (mine == theirs and self.eval_loss < other.eval_loss)

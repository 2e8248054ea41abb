"""The training loop's own state (where it is, what it measured, the best adapter so far), and
what a finished run reports from it.

A checkpoint saves it next to the model, optimizer, schedule and RNG streams (see
``checkpoint``): the counters and evaluations as JSON (``trainer_state.json``), the best
adapter's weights as safetensors. The JSON layout is the one the loop wrote as a plain dict
before this class existed, so those checkpoints load as they are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from swarm_contracts.evals import EvalResult
from swarm_trainer.reports import Evaluation

if TYPE_CHECKING:
    import torch


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    data_index: int = 0  # micro-batches consumed: the sampler's position
    train_loss: float | None = None  # of the last step
    eval_history: list[Evaluation] = field(default_factory=list)
    best: Evaluation | None = None  # lowest eval loss (or best ``select_by`` metric) so far
    best_evals: EvalResult | None = None  # the task evals at ``best``, with their sample
    # The adapter weights at ``best`` (kept in memory: LoRA weights are small).
    best_weights: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)
    # step -> training loss, kept by a replay only (it reports them; a checkpoint does not).
    losses: dict[int, float] = field(default_factory=dict, repr=False, compare=False)

    def stepped(self, loss: float, micro_batches: int) -> None:
        self.step += 1
        self.data_index += micro_batches
        self.train_loss = loss

    def evaluated(self, evaluation: Evaluation, select_by: str | None = None) -> bool:
        """Record an evaluation; True when it is the best so far (keep its weights then):
        the lowest eval loss, or the highest ``select_by`` task metric."""
        self.eval_history.append(evaluation)
        if self.best is None or evaluation.better_than(self.best, select_by):
            self.best = evaluation
            return True
        return False

    def metrics(self, elapsed_s: float) -> TrainMetrics:
        best = self.best
        return TrainMetrics(
            step=self.step,
            train_loss=self.train_loss,
            eval_history=self.eval_history,
            best_step=best.step if best else None,
            elapsed_s=elapsed_s,
            eval_loss=best.eval_loss if best else None,
            perplexity=best.perplexity if best else None,
            last_eval_loss=self.eval_history[-1].eval_loss if best else None,
            evals=self.best_evals,
        )

    def to_json(self) -> dict[str, Any]:
        """Everything but the weights, which the checkpoint writes as safetensors."""
        data: dict[str, Any] = {
            "step": self.step,
            "data_index": self.data_index,
            "eval_history": [_evaluation_json(e) for e in self.eval_history],
            "train_loss": self.train_loss,
            "best": _evaluation_json(self.best) if self.best else None,
        }
        # Without task evals, the layout checkpoints had before them.
        if self.best_evals is not None:
            data["best_evals"] = self.best_evals.model_dump(mode="json")
        return data

    @classmethod
    def from_json(
        cls, data: dict[str, Any], best_weights: dict[str, torch.Tensor] | None = None
    ) -> TrainState:
        best = data.get("best")
        best_evals = data.get("best_evals")
        return cls(
            step=int(data["step"]),
            data_index=int(data.get("data_index", 0)),
            train_loss=data.get("train_loss"),
            eval_history=[Evaluation(**e) for e in data.get("eval_history", [])],
            best=Evaluation(**best) if best else None,
            best_weights=best_weights,
            best_evals=EvalResult.model_validate(best_evals) if best_evals else None,
        )


def _evaluation_json(evaluation: Evaluation) -> dict[str, Any]:
    data = asdict(evaluation)
    if not data["task"]:
        del data["task"]
    return data


class TrainMetrics(BaseModel):
    """What a finished run measured. Rank 0 writes it next to the adapter
    (``layout.output_result``) and the agent reads it from there, so a run's outcome never
    depends on a queue message. The eval figures are the best evaluation's: they describe the
    adapter registered, which is the best one, not the last."""

    step: int
    train_loss: float | None = None
    eval_history: list[Evaluation] = []
    best_step: int | None = None
    elapsed_s: float
    eval_loss: float | None = None
    perplexity: float | None = None
    last_eval_loss: float | None = None
    # The task evals of the adapter registered (the best evaluation's).
    evals: EvalResult | None = None

    def event_metrics(self) -> dict[str, float]:
        """The figures of the ``succeeded`` event and the adapter's lineage."""
        figures = {
            "train_loss": self.train_loss,
            "eval_loss": self.eval_loss,
            "perplexity": self.perplexity,
            "elapsed_s": self.elapsed_s,
            "step": self.step,
        }
        task = self.evals.metrics if self.evals else {}
        return {name: float(v) for name, v in (figures | task).items() if v is not None}

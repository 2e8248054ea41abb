"""Asynchronous successive halving (ASHA) over the trials' evaluations: pure decisions.

Rungs are at steps ``min_step * reduction_factor**k`` (below ``max_step``). A trial reaches a
rung with its first evaluation at or after that step; its metric there is compared with what
the *other* trials had at the same rung (their first evaluation at or after it). If it is worse
than the ``1/reduction_factor`` quantile of those (the cut between the best third, say, and the
rest), the trial is stopped. A trial alone at a rung, or tied with the cut, goes on. This is the
stopping form of ASHA (as in Ray Tune's ``ASHAScheduler``): trials run to the end unless a rung
stops them, so no trial waits for a promotion.

Optuna's ``SuccessiveHalvingPruner`` decides the same kind of thing, but from rung bookkeeping
it keeps in the live study's trial attributes; here a decision is a function of the recorded
evaluations alone, so a restarted controller (which rebuilds everything from the records)
decides exactly as the one before it would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from swarm_contracts.sweeps import SweepSpec

Mode = Literal["min", "max"]


@dataclass(frozen=True)
class Prune:
    rung: int  # the rung's step
    step: int  # the evaluation that reached it
    value: float
    cutoff: float


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation (numpy's default), infinities allowed."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lo, hi = math.floor(position), math.ceil(position)
    if ordered[lo] == ordered[hi]:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def at_rung(evals: Mapping[int, float], rung: int) -> tuple[int, float] | None:
    """The trial's first evaluation at or after ``rung``: (step, value), or None."""
    steps = [s for s in evals if s >= rung]
    if not steps:
        return None
    step = min(steps)
    return step, evals[step]


@dataclass(frozen=True)
class Halving:
    min_step: int
    reduction_factor: int
    max_step: int
    mode: Mode = "min"

    @classmethod
    def of(cls, spec: SweepSpec) -> Halving | None:
        """The sweep's early-stopping rule, or None when it has none."""
        asha = spec.early_stopping
        if asha is None:
            return None
        training = spec.base.training
        return cls(
            min_step=asha.min_step or training.eval_every,
            reduction_factor=asha.reduction_factor,
            max_step=asha.max_step or training.max_steps,
            mode=spec.mode,
        )

    def rungs(self) -> list[int]:
        rungs, step = [], self.min_step
        while step < self.max_step:
            rungs.append(step)
            step *= self.reduction_factor
        return rungs

    def _score(self, value: float) -> float:
        """Lower is better; a non-finite metric (a diverged trial) is the worst there is."""
        if not math.isfinite(value):
            return math.inf
        return value if self.mode == "min" else -value

    def decide(
        self, evals: Mapping[int, float], step: int, others: Iterable[Mapping[int, float]]
    ) -> Prune | None:
        """Whether the trial whose evaluations are ``evals`` must stop, now that its
        evaluation at ``step`` came in; ``others``: the other trials' evaluations."""
        others = list(others)
        for rung in self.rungs():
            reached = at_rung(evals, rung)
            if reached is None or reached[0] != step:
                continue  # not reached yet, or reached earlier (decided then)
            theirs = [v for o in others if (r := at_rung(o, rung)) is not None for v in [r[1]]]
            if not theirs:
                continue
            scores = [self._score(v) for v in theirs]
            cutoff = quantile(scores, 1 / self.reduction_factor)
            if self._score(reached[1]) > cutoff:
                shown = cutoff if self.mode == "min" else -cutoff
                return Prune(rung=rung, step=step, value=reached[1], cutoff=shown)
        return None

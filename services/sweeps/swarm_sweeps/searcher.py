"""Proposing trials with Optuna, driven ask/tell style from the trial records in KV.

The Optuna study is never the state: before each proposal it is rebuilt from the sweep's trial
records (every recorded trial added with its parameters, its evaluations as intermediate
values and its outcome: complete, pruned, failed, or still running), then asked for the next
trial. The sampler is seeded from the sweep's seed and the trial number, so a proposal is a
pure function of the records: a controller restarted after a crash proposes for trial ``n``
exactly what the one before it would have (or did, if it crashed before recording it).

* ``random``: Optuna's ``RandomSampler``.
* ``bayes``: Optuna's ``TPESampler`` (multivariate, with the *constant liar* for trials still
  running, so concurrent proposals spread out), random for the first ``startup_trials``.
* ``grid``: trial ``n`` is grid point ``n`` (``swarm_contracts.sweeps.grid_point``), enqueued into
  the study so that Optuna still hands it out.

Choices are searched as the index of the value (Optuna's categorical distributions take
scalars only; a choice may be a list such as target modules).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import TrialState as OptunaState
from optuna.trial import create_trial

from swarm_contracts.sweeps import (
    Choice,
    IntRange,
    LogUniform,
    SweepSpec,
    TrialRecord,
    TrialState,
    Uniform,
    grid_point,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

_STATES = {
    TrialState.pruned: OptunaState.PRUNED,
    TrialState.failed: OptunaState.FAIL,
    TrialState.cancelled: OptunaState.FAIL,
}


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    # The trials whose outcome the study held when it proposed this one.
    told: list[int]


def distribution(param: Any) -> BaseDistribution:
    match param:
        case Uniform():
            return FloatDistribution(param.low, param.high)
        case LogUniform():
            return FloatDistribution(param.low, param.high, log=True)
        case IntRange():
            return IntDistribution(param.low, param.high, step=param.step, log=param.log)
        case Choice():
            return CategoricalDistribution(list(range(len(param.values))))
    raise TypeError(f"no distribution for {param!r}")


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class Searcher:
    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.distributions = {path: distribution(p) for path, p in spec.search.items()}

    # --- parameters: job spec values <-> Optuna's ----------------------------------------------

    def encode(self, params: dict[str, Any]) -> dict[str, Any]:
        encoded = {}
        for path, value in params.items():
            param = self.spec.search[path]
            if isinstance(param, Choice):
                encoded[path] = next(i for i, v in enumerate(param.values) if _same(v, value))
            else:
                encoded[path] = value
        return encoded

    def decode(self, params: dict[str, Any]) -> dict[str, Any]:
        decoded = {}
        for path, value in params.items():
            param = self.spec.search[path]
            decoded[path] = param.values[value] if isinstance(param, Choice) else value
        return decoded

    # --- the study ---------------------------------------------------------------------------

    def _sampler(self, trial: int) -> BaseSampler:
        seed = (self.spec.seed * 1_000_003 + trial) % 2**32
        if self.spec.algorithm == "bayes":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return TPESampler(
                    seed=seed,
                    n_startup_trials=self.spec.startup(),
                    multivariate=True,
                    constant_liar=True,
                )
        return RandomSampler(seed=seed)

    def study(self, trials: Sequence[TrialRecord], sampler: BaseSampler | None = None) -> Any:
        """An in-memory study told every recorded trial, in trial order."""
        direction: Literal["minimize", "maximize"] = (
            "minimize" if self.spec.mode == "min" else "maximize"
        )
        study = optuna.create_study(direction=direction, sampler=sampler or RandomSampler(0))
        for record in sorted(trials, key=lambda t: t.trial):
            intermediate = {s: v for s, v in record.evals.items() if math.isfinite(v)}
            state, value = self._outcome(record)
            study.add_trial(
                create_trial(
                    params=self.encode(record.params),
                    distributions=self.distributions,
                    value=value,
                    state=state,
                    intermediate_values=intermediate,
                    user_attrs={"trial": record.trial},
                )
            )
        return study

    @staticmethod
    def _outcome(record: TrialRecord) -> tuple[OptunaState, float | None]:
        if not record.state.terminal:
            return OptunaState.RUNNING, None
        if record.state == TrialState.succeeded:
            if record.value is not None and math.isfinite(record.value):
                return OptunaState.COMPLETE, record.value
            return OptunaState.FAIL, None
        return _STATES[record.state], None

    def propose(self, trial: int, trials: Sequence[TrialRecord]) -> Proposal:
        """The parameters of trial number ``trial``, given every trial recorded so far."""
        study = self.study(trials, self._sampler(trial))
        if self.spec.algorithm == "grid":
            study.enqueue_trial(self.encode(grid_point(self.spec.search, trial)))
        told = [t.user_attrs["trial"] for t in study.trials if t.state.is_finished()]
        asked = study.ask(self.distributions)
        return Proposal(params=self.decode(asked.params), told=told)

"""The searcher: Optuna studies rebuilt from trial records, and what they propose."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
from optuna.trial import TrialState as OptunaState

from swarm_contracts.sweeps import SweepSpec, TrialRecord, TrialState, grid_point
from swarm_sweeps.searcher import Searcher

BASE = {"base_model": "tiny", "dataset": "ds-" + "ab" * 12}
TARGETS = [["q_proj", "v_proj"], "all-linear"]


def sweep(algorithm: str = "bayes", **overrides: Any) -> SweepSpec:
    search = {
        "training.lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1},
        "lora.r": {"type": "choice", "values": [4, 8, 16]},
        "lora.target_modules": {"type": "choice", "values": TARGETS},
        "training.warmup_steps": {"type": "int", "low": 0, "high": 20, "step": 5},
    }
    if algorithm == "grid":
        search = {k: v for k, v in search.items() if v["type"] != "log_uniform"}
    return SweepSpec.model_validate(
        {"name": "s", "base": BASE, "search": search, "algorithm": algorithm, "budget": 12}
        | overrides
    )


def record(n: int, params: dict[str, Any], state: TrialState, **fields: Any) -> TrialRecord:
    return TrialRecord(
        sweep_id="sweep-0123456789",
        trial=n,
        job_id=f"job-{n:08d}",
        params=params,
        state=state,
        **fields,
    )


def test_the_study_is_rebuilt_from_the_records_with_every_outcome() -> None:
    searcher = Searcher(sweep())
    p = {
        "training.lr": 1e-3,
        "lora.r": 8,
        "lora.target_modules": "all-linear",
        "training.warmup_steps": 5,
    }
    records = [
        record(0, p, TrialState.succeeded, value=1.5, evals={2: 2.0, 4: 1.5}),
        record(1, p, TrialState.pruned, evals={2: 9.0}),
        record(2, p, TrialState.failed, reason="boom"),
        record(3, p, TrialState.running, evals={2: 1.9}),
        record(4, p, TrialState.succeeded, value=math.nan),  # diverged: no value to learn from
    ]
    study = searcher.study(list(reversed(records)))  # order of the records does not matter
    trials = study.trials
    assert [t.user_attrs["trial"] for t in trials] == [0, 1, 2, 3, 4]
    assert [t.state for t in trials] == [
        OptunaState.COMPLETE,
        OptunaState.PRUNED,
        OptunaState.FAIL,
        OptunaState.RUNNING,
        OptunaState.FAIL,
    ]
    assert trials[0].value == 1.5
    assert trials[0].intermediate_values == {2: 2.0, 4: 1.5}
    assert trials[1].intermediate_values == {2: 9.0}
    # Choices travel as indexes and come back as the values.
    assert trials[0].params["lora.r"] == 1
    assert trials[0].params["lora.target_modules"] == 1
    assert searcher.decode(trials[0].params) == p
    assert study.best_trial.user_attrs["trial"] == 0


def test_a_proposal_is_a_function_of_the_records_so_a_restart_proposes_the_same() -> None:
    spec = sweep()
    records = []
    for n in range(6):
        proposal = Searcher(spec).propose(n, records)
        # A controller restarted at this point (a new Searcher, the same records) agrees.
        assert Searcher(spec).propose(n, records) == proposal
        records.append(record(n, proposal.params, TrialState.succeeded, value=float(n)))
    assert len({str(r.params) for r in records}) == 6  # and the proposals differ


def test_random_proposals_respect_the_space() -> None:
    searcher = Searcher(sweep("random"))
    for n in range(30):
        params = searcher.propose(n, []).params
        assert 1e-5 <= params["training.lr"] <= 1e-1
        assert params["lora.r"] in (4, 8, 16)
        assert params["lora.target_modules"] in TARGETS
        assert params["training.warmup_steps"] in (0, 5, 10, 15, 20)


def test_grid_trial_n_is_grid_point_n() -> None:
    spec = sweep("grid", budget=None)
    assert spec.budget == 3 * 2 * 5
    searcher = Searcher(spec)
    records: list[TrialRecord] = []
    for n in range(spec.trials):
        params = searcher.propose(n, records).params
        assert params == grid_point(spec.search, n)
        records.append(record(n, params, TrialState.running))
    assert len({str(r.params) for r in records}) == spec.trials


def _lr_sweep(startup: int) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "s",
            "base": BASE,
            "search": {"training.lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1}},
            "budget": 40,
            "startup_trials": startup,
        }
    )


@pytest.mark.parametrize("best_log_lr", [-4.5, -1.5])
def test_bayes_proposes_from_what_it_was_told(best_log_lr: float) -> None:
    """Told that the metric is best near lr = 10**best_log_lr, TPE proposes near there."""
    spec = _lr_sweep(startup=5)
    searcher = Searcher(spec)
    records = []
    for n in range(16):
        lr = 10 ** (-5 + 4 * n / 15)  # an even sweep over the range
        loss = (math.log10(lr) - best_log_lr) ** 2
        records.append(record(n, {"training.lr": lr}, TrialState.succeeded, value=loss))
    proposals = [searcher.propose(n, records) for n in range(16, 26)]
    assert all(p.told == list(range(16)) for p in proposals)
    median = statistics.median(math.log10(p.params["training.lr"]) for p in proposals)
    assert abs(median - best_log_lr) < 1.0, median


def test_bayes_is_random_until_the_startup_trials_are_told() -> None:
    spec = _lr_sweep(startup=5)
    searcher = Searcher(spec)
    told = [record(n, {"training.lr": 1e-3}, TrialState.succeeded, value=1.0) for n in range(4)]
    # With fewer results than startup_trials, TPE samples at random: the same as it would
    # with nothing told at all.
    assert searcher.propose(4, told).params == searcher.propose(4, []).params

"""ASHA decisions: pure functions of the recorded evaluations."""

from __future__ import annotations

import math

import pytest

from swarm_contracts.sweeps import SweepSpec
from swarm_sweeps.asha import Halving, Prune, at_rung, quantile

HALVING = Halving(min_step=2, reduction_factor=2, max_step=16)


def test_rungs_grow_by_the_reduction_factor_below_the_last_step() -> None:
    assert HALVING.rungs() == [2, 4, 8]
    assert Halving(min_step=3, reduction_factor=3, max_step=27).rungs() == [3, 9]
    assert Halving(min_step=8, reduction_factor=2, max_step=8).rungs() == []


def test_the_rule_comes_from_the_spec_with_the_base_specs_defaults() -> None:
    spec = SweepSpec.model_validate(
        {
            "name": "s",
            "base": {
                "base_model": "tiny",
                "dataset": "ds-" + "ab" * 12,
                "training": {"max_steps": 8, "eval_every": 2},
            },
            "search": {"training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-2}},
            "budget": 4,
            "early_stopping": {"type": "asha", "reduction_factor": 2},
        }
    )
    assert Halving.of(spec) == Halving(min_step=2, reduction_factor=2, max_step=8, mode="min")
    assert Halving.of(spec.model_copy(update={"early_stopping": None})) is None


def test_a_trial_clearly_worse_at_a_rung_is_stopped_there() -> None:
    others = [{2: 1.0, 4: 0.8}, {2: 1.2, 4: 0.9}, {2: 1.1}]
    decision = HALVING.decide({2: 5.0}, 2, others)
    # The cut is the best half (1/reduction_factor) of the others' values at step 2.
    assert decision == Prune(rung=2, step=2, value=5.0, cutoff=pytest.approx(1.1))
    # Among the best half: goes on.
    assert HALVING.decide({2: 1.05}, 2, others) is None
    # Tied with the cut: goes on.
    assert HALVING.decide({2: 1.1}, 2, others) is None


def test_a_trial_alone_at_a_rung_goes_on() -> None:
    assert HALVING.decide({2: 50.0}, 2, []) is None
    # Others that have not reached the rung yet do not count.
    assert HALVING.decide({2: 1.0, 4: 50.0}, 4, [{2: 0.5}]) is None


def test_only_the_evaluation_that_reaches_a_rung_decides() -> None:
    others = [{2: 1.0, 4: 0.5}]
    # Step 3 reaches no rung (2 was reached at step 2, 4 not yet).
    assert HALVING.decide({2: 1.0, 3: 9.0}, 3, others) is None
    # An evaluation at step 5 is the first at or after rung 4: it is compared with the
    # others' values at rung 4.
    decision = HALVING.decide({2: 1.0, 5: 0.7}, 5, others)
    assert decision == Prune(rung=4, step=5, value=0.7, cutoff=0.5)


def test_one_evaluation_past_several_rungs_is_judged_at_each() -> None:
    others = [{2: 9.0, 4: 0.1}]
    # eval_every 4 with rungs at 2 and 4: step 4 reaches both; rung 2 passes, rung 4 stops it.
    decision = HALVING.decide({4: 1.0}, 4, others)
    assert decision is not None
    assert decision.rung == 4


def test_maximizing_keeps_the_highest() -> None:
    halving = Halving(min_step=2, reduction_factor=2, max_step=16, mode="max")
    others = [{2: 10.0}, {2: 20.0}]
    decision = halving.decide({2: 5.0}, 2, others)
    assert decision is not None
    assert decision.cutoff == pytest.approx(15.0)
    assert halving.decide({2: 16.0}, 2, others) is None


def test_a_diverged_trial_is_the_worst_and_a_diverged_other_never_protects() -> None:
    assert HALVING.decide({2: math.nan}, 2, [{2: 3.0}]) is not None
    assert HALVING.decide({2: math.inf}, 2, [{2: 3.0}]) is not None
    # The others' cut with a diverged one among them: the finite best still sets it.
    decision = HALVING.decide({2: 4.0}, 2, [{2: 3.0}, {2: math.nan}, {2: 2.0}])
    assert decision is not None
    assert decision.cutoff == pytest.approx(3.0)


def test_helpers() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert quantile([1.0, math.inf], 0.5) == math.inf
    assert at_rung({2: 1.0, 6: 0.5, 4: 0.7}, 3) == (4, 0.7)
    assert at_rung({2: 1.0}, 3) is None

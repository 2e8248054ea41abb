"""What a sweep ranks its trials by, read from each validation: a loss, or a task metric."""

from __future__ import annotations

from swarm_contracts.evals import EvalResult
from swarm_contracts.events import Validated
from swarm_sweeps.asha import Halving
from swarm_sweeps.controller import metric_of


def validated(exact_match: float | None) -> Validated:
    evals = (
        EvalResult(step=2, metrics={"exact_match": exact_match}, examples=10)
        if exact_match is not None
        else None
    )
    return Validated(job_id="job-1", step=2, eval_loss=1.5, perplexity=4.5, evals=evals)


def test_the_sweep_metric_comes_from_the_validation() -> None:
    assert metric_of(validated(0.7), "eval_loss") == 1.5
    assert metric_of(validated(0.7), "perplexity") == 4.5
    assert metric_of(validated(0.7), "exact_match") == 0.7
    assert metric_of(validated(None), "exact_match") is None


def test_asha_on_a_task_metric_stops_the_trial_that_scores_lower() -> None:
    rule = Halving(min_step=2, max_step=8, reduction_factor=2, mode="max")
    others = [{2: 0.9}, {2: 0.8}, {2: 0.85}]
    assert rule.decide({2: 0.1}, 2, others) is not None
    assert rule.decide({2: 0.95}, 2, others) is None

"""The ``evals`` of a job spec: what parses, and what is refused with a message saying why."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from swarm_contracts.evals import EvalResult, EvalSample
from swarm_contracts.events import Validated
from swarm_contracts.jobs import JobSpec
from swarm_contracts.sweeps import SweepSpec

BASE = {"name": "a", "base_model": "tiny", "dataset": "ds-" + "0" * 24}


def spec(**evals: object) -> JobSpec:
    return JobSpec.model_validate(BASE | {"evals": evals})


def test_a_spec_with_every_grader_parses_and_names_its_metrics() -> None:
    s = spec(
        fraction=0.1,
        graders=[
            {"type": "exact_match", "case_sensitive": False},
            {"type": "contains"},
            {"type": "regex", "pattern": r"^\d+$"},
            {"type": "json_valid", "schema": {"type": "object"}},
            {"type": "choice", "options": ["yes", "no"], "name": "yes_no"},
        ],
        max_new_tokens=16,
        select_by="exact_match",
    )
    assert s.evals is not None
    assert s.evals.metrics == ["exact_match", "contains", "regex", "json_valid", "yes_no"]
    # The schema round-trips under its own name.
    dumped = s.model_dump(mode="json")["evals"]["graders"][3]
    assert dumped["schema"] == {"type": "object"}
    assert JobSpec.model_validate(s.model_dump(mode="json")) == s


@pytest.mark.parametrize(
    ("evals", "message"),
    [
        ({"graders": [{"type": "bleu"}]}, "does not match any of the expected tags"),
        ({"graders": [{"type": "regex", "pattern": "(unclosed"}]}, "invalid regular expression"),
        ({"graders": []}, "at least 1 item"),
        ({"graders": [{"type": "exact_match"}], "max_new_tokens": 0}, "greater than or equal"),
        ({"graders": [{"type": "exact_match"}], "max_new_tokens": 100_000}, "less than or equal"),
        ({"graders": [{"type": "exact_match"}], "fraction": 0}, "greater than 0"),
        (
            {"graders": [{"type": "exact_match"}], "fraction": 0.1, "dataset": BASE["dataset"]},
            "not both",
        ),
        ({"graders": [{"type": "exact_match"}, {"type": "exact_match"}]}, "same metric"),
        ({"graders": [{"type": "exact_match"}], "select_by": "contains"}, "none of the graders"),
        ({"graders": [{"type": "choice", "options": ["only"]}]}, "at least 2 items"),
        ({"graders": [{"type": "exact_match", "typo": 1}]}, "Extra inputs"),
    ],
)
def test_bad_evals_are_refused_saying_why(evals: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**evals)


def test_the_validated_event_carries_the_task_metrics_and_sample() -> None:
    result = EvalResult(
        step=5,
        metrics={"exact_match": 0.5},
        examples=2,
        samples=[EvalSample(prompt="p", expected="a", got="b", scores={"exact_match": 0.0})],
    )
    event = Validated(job_id="job-1", step=5, eval_loss=1.0, perplexity=2.7, evals=result)
    again = Validated.model_validate_json(event.model_dump_json())
    assert again.evals == result
    # Without evals the event is as before.
    assert Validated(job_id="job-1", step=5, eval_loss=1.0, perplexity=2.7).evals is None


def sweep(base_evals: dict | None = None, **overrides: object) -> SweepSpec:
    base = {"base_model": "tiny", "dataset": BASE["dataset"]}
    if base_evals is not None:
        base["evals"] = base_evals
    return SweepSpec.model_validate(
        {
            "name": "s",
            "base": base,
            "algorithm": "random",
            "budget": 2,
            "search": {"training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-2}},
        }
        | overrides
    )


def test_a_sweep_may_rank_trials_by_a_task_metric_highest_first() -> None:
    evals = {"graders": [{"type": "exact_match"}]}
    assert sweep(evals, metric="exact_match").mode == "max"
    assert sweep(evals, metric="exact_match", mode="min").mode == "min"
    assert sweep(evals).mode == "min"  # eval_loss, as before
    with pytest.raises(ValidationError, match="base has no evals"):
        sweep(None, metric="exact_match")
    with pytest.raises(ValidationError, match="neither eval_loss"):
        sweep(evals, metric="contains")

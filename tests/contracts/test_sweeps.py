"""The sweep spec contract: search spaces checked against the job spec, trial specs, ids."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from swarm_contracts.jobs import JobSpec
from swarm_contracts.sweeps import (
    SweepRecord,
    SweepSpec,
    TrialRecord,
    grid_point,
    grid_size,
    sweep_id_for,
    trial_job_id,
    trial_spec,
)

BASE = {"base_model": "tiny-llama", "dataset": "ds-" + "ab" * 12, "training": {"max_steps": 8}}
LR = {"type": "log_uniform", "low": 1e-5, "high": 1e-2}


def sweep(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "lr-search",
        "base": BASE,
        "search": {"training.lr": LR},
        "budget": 6,
    } | overrides


def errors(data: dict[str, Any]) -> list[tuple[tuple, str]]:
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(data)
    return [(e["loc"], e["msg"]) for e in info.value.errors()]


def test_a_minimal_sweep_gets_defaults() -> None:
    s = SweepSpec.model_validate(sweep())
    assert (s.algorithm, s.metric, s.mode, s.max_concurrent, s.early_stopping) == (
        "bayes",
        "eval_loss",
        "min",
        2,
        None,
    )
    assert s.trials == 6
    assert s.startup() == 2
    assert SweepSpec.model_validate_json(s.model_dump_json()) == s


def test_every_kind_of_parameter_over_the_job_spec() -> None:
    s = SweepSpec.model_validate(
        sweep(
            search={
                "training.lr": LR,
                "lora.alpha": {"type": "uniform", "low": 8, "high": 32},
                "lora.r": {"type": "choice", "values": [4, 8, 16]},
                "training.warmup_steps": {"type": "int", "low": 0, "high": 20, "step": 5},
                "lora.target_modules": {"type": "choice", "values": [["q_proj"], "all-linear"]},
            },
            early_stopping={"type": "asha", "min_step": 2, "reduction_factor": 2},
        )
    )
    spec = trial_spec(
        s,
        {
            "training.lr": 1e-3,
            "lora.alpha": 12.5,
            "lora.r": 16,
            "training.warmup_steps": 5,
            "lora.target_modules": "all-linear",
        },
    )
    assert isinstance(spec, JobSpec)
    assert spec.name == "lr-search"
    assert (spec.training.lr, spec.lora.alpha, spec.lora.r) == (1e-3, 12.5, 16)
    assert spec.training.warmup_steps == 5
    assert spec.lora.target_modules == "all-linear"
    assert spec.training.max_steps == 8  # the base's


def test_a_dpo_sweep_searches_beta() -> None:
    """``method.beta`` is a field of DPO's method: searchable when the base is a DPO job."""
    base = BASE | {"method": {"type": "dpo"}}
    beta = {"type": "log_uniform", "low": 0.01, "high": 1.0}
    s = SweepSpec.model_validate(sweep(base=base, search={"method.beta": beta}))
    spec = trial_spec(s, {"method.beta": 0.3})
    assert spec.method.type == "dpo"
    assert spec.method.beta == 0.3
    [(_, msg)] = errors(sweep(search={"method.beta": beta}))  # an SFT base has no beta
    assert "search.method.beta" in msg
    [(_, msg)] = errors(sweep(base=base, search={"method.beta": beta | {"high": 200.0}}))
    assert "200.0 is not valid there" in msg
    [(_, msg)] = errors(sweep(base=base, search={"method.gamma": beta}))
    assert "method has no field 'gamma'" in msg


@pytest.mark.parametrize(
    ("search", "says"),
    [
        ({"training.lr": {"type": "uniform", "low": 0.1, "high": 2}}, "2.0 is not valid there"),
        ({"lora.r": {"type": "uniform", "low": 1, "high": 4}}, "not a float"),
        ({"lora.r": {"type": "choice", "values": [8, 512]}}, "512 is not valid there"),
        ({"lora.target_modules": {"type": "int", "low": 1, "high": 2}}, "not a number"),
        ({"training.nope": {"type": "choice", "values": [1]}}, "training has no field 'nope'"),
        ({"lora": {"type": "choice", "values": [1]}}, "not a whole section"),
        ({"name": {"type": "choice", "values": ["a", "b"]}}, "name cannot be searched"),
        ({"priority.x": {"type": "choice", "values": [1]}}, "priority has no fields"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(search: dict, says: str) -> None:
    [(loc, msg)] = errors(sweep(search=search))
    assert loc == ("search",)
    assert f"search.{next(iter(search))}" in msg
    assert says in msg


@pytest.mark.parametrize(
    ("param", "field"),
    [
        ({"type": "log_uniform", "low": 0, "high": 1e-2}, "low"),
        ({"type": "uniform", "low": 0.5, "high": 0.1}, "low must be below high"),
        ({"type": "choice", "values": []}, "values"),
        ({"type": "choice", "values": [1, 1]}, "distinct"),
        ({"type": "int", "low": 0, "high": 4, "log": True}, "log int range"),
        ({"type": "normal", "mu": 0}, "does not match any of the expected tags"),
    ],
)
def test_a_malformed_range_is_refused(param: dict, field: str) -> None:
    found = errors(sweep(search={"training.warmup_steps": param}))
    assert any(field in str(loc) or field in msg for loc, msg in found), found


def test_budget_and_grid() -> None:
    assert ("budget",) in [loc for loc, _ in errors(sweep(budget=None))]
    grid = {
        "lora.r": {"type": "choice", "values": [4, 8]},
        "training.warmup_steps": {"type": "int", "low": 0, "high": 4, "step": 2},
    }
    s = SweepSpec.model_validate(sweep(algorithm="grid", search=grid, budget=None))
    assert grid_size(s.search) == 6
    assert s.trials == 6
    assert [grid_point(s.search, i) for i in (0, 1, 5)] == [
        {"lora.r": 4, "training.warmup_steps": 0},
        {"lora.r": 4, "training.warmup_steps": 2},
        {"lora.r": 8, "training.warmup_steps": 4},
    ]
    [(loc, msg)] = errors(sweep(algorithm="grid", search=grid, budget=7))
    assert loc == ("budget",)
    assert "above the grid's 6 points" in msg
    [(loc, msg)] = errors(sweep(algorithm="grid"))
    assert loc == ("search",)
    assert "grid search needs choice or int" in msg


def test_the_base_spec_is_a_job_spec_named_after_the_sweep() -> None:
    assert SweepSpec.model_validate(sweep(base=BASE | {"name": "lr-search"})).base.name
    [(_, msg)] = errors(sweep(base=BASE | {"name": "other"}))
    assert "base.name must be left out or equal name" in msg
    found = errors(sweep(base=BASE | {"training": {"lr": 5}}))
    assert ("base", "training", "lr") in [loc for loc, _ in found]
    assert ("base", "surprise") in [loc for loc, _ in errors(sweep(base=BASE | {"surprise": 1}))]
    assert ("surprise",) in [loc for loc, _ in errors(sweep(surprise=1))]


def test_ids_are_pure_functions_of_tenant_and_key() -> None:
    assert sweep_id_for("acme", "k") == sweep_id_for("acme", "k") != sweep_id_for("other", "k")
    assert sweep_id_for("acme", "k").startswith("sweep-")
    sweep_id = sweep_id_for("acme", "k")
    assert trial_job_id("acme", sweep_id, 0) == trial_job_id("acme", sweep_id, 0)
    assert trial_job_id("acme", sweep_id, 0) != trial_job_id("acme", sweep_id, 1)


def test_records_round_trip_with_their_evaluations() -> None:
    spec = SweepSpec.model_validate(sweep())
    sweep_record = SweepRecord(sweep_id="sweep-0123456789", tenant="acme", spec=spec)
    assert SweepRecord.model_validate_json(sweep_record.model_dump_json()) == sweep_record
    trial = TrialRecord(
        sweep_id="sweep-0123456789",
        trial=3,
        job_id="job-01234567",
        params={"training.lr": 1e-3},
        evals={2: 1.5, 4: 1.25},
    )
    again = TrialRecord.model_validate_json(trial.model_dump_json())
    assert again.evals == {2: 1.5, 4: 1.25}
    assert again.key == "sweep-0123456789.00003"

"""The job spec contract: bounds checked, unknown fields rejected, deterministic job ids."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from swarm_contracts.jobs import (
    JobRecord,
    JobSpec,
    JobState,
    JobSubmission,
    job_id_for,
    parse_checkpoint_ref,
)

DATASET = "ds-" + "ab" * 12


def spec(**overrides: Any) -> dict[str, Any]:
    return {"name": "support-bot", "base_model": "tiny-llama", "dataset": DATASET, **overrides}


def test_minimal_spec_gets_defaults() -> None:
    s = JobSpec.model_validate(spec())
    assert s.lora.r == 8
    assert s.lora.alpha == 16
    assert s.lora.target_modules == ["q_proj", "v_proj"]
    assert s.training.max_steps == 200
    assert s.training.precision == "auto"
    assert s.resources.workers == 1
    assert s.resources.gpus_per_worker == 0
    assert s.priority == 5
    assert s.validation is None


def test_full_contract_example() -> None:
    s = JobSpec.model_validate(
        spec(
            base_model="tiny-llama@3",
            validation="ds-" + "0" * 64,
            lora={"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"},
            training={
                "max_steps": 200,
                "batch_size": 8,
                "grad_accum": 1,
                "lr": 2e-4,
                "warmup_steps": 10,
                "seq_len": 256,
                "seed": 0,
                "eval_every": 50,
                "checkpoint_every": 50,
                "precision": "bf16",
            },
            resources={"workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 4},
            priority=10,
        )
    )
    assert s.lora.target_modules == "all-linear"
    assert JobSpec.model_validate_json(s.model_dump_json()) == s


@pytest.mark.parametrize(
    "overrides",
    [
        {"surprise": 1},
        {"lora": {"r": 8, "rank": 4}},
        {"training": {"max_step": 10}},
        {"resources": {"gpu": 1}},
    ],
)
def test_unknown_fields_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec(**overrides))
    assert "extra" in str(info.value).lower()


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "Bad Name"},
        {"name": "a.b"},
        {"name": "a*"},
        {"name": ""},
        {"name": "x" * 64},
        {"base_model": "m@v1"},
        {"base_model": "m.x"},
        {"dataset": "not-a-dataset"},
        {"dataset": "ds-XYZ"},
        {"validation": "ds-1"},
        {"priority": -1},
        {"priority": 11},
        {"lora": {"r": 0}},
        {"lora": {"r": 257}},
        {"lora": {"alpha": 0}},
        {"lora": {"dropout": 1.0}},
        {"lora": {"dropout": -0.1}},
        {"lora": {"target_modules": []}},
        {"lora": {"target_modules": "everything"}},
        {"training": {"max_steps": 0}},
        {"training": {"batch_size": 0}},
        {"training": {"lr": 0}},
        {"training": {"lr": 2.0}},
        {"training": {"seq_len": 4}},
        {"training": {"warmup_steps": -1}},
        {"training": {"precision": "fp8"}},
        {"training": {"val_fraction": 1.0}},
        {"resources": {"workers": 0}},
        {"resources": {"workers": 257}},
        {"resources": {"gpus_per_worker": -1}},
        {"resources": {"cpus_per_worker": 0}},
    ],
)
def test_bounds_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(**overrides))


@pytest.mark.parametrize("missing", ["name", "base_model", "dataset"])
def test_required_fields(missing: str) -> None:
    data = spec()
    del data[missing]
    with pytest.raises(ValidationError):
        JobSpec.model_validate(data)


def test_submission() -> None:
    sub = JobSubmission.model_validate({"spec": spec()})
    assert sub.tenant == "default"
    assert sub.job_id is None
    with pytest.raises(ValidationError):
        JobSubmission.model_validate({"spec": spec(), "job_id": "nope"})
    with pytest.raises(ValidationError):
        JobSubmission.model_validate({"spec": spec(), "extra": True})
    ok = JobSubmission.model_validate({"spec": spec(), "job_id": job_id_for("t", "k")})
    assert ok.job_id == job_id_for("t", "k")


def test_job_id_for_is_deterministic() -> None:
    a = job_id_for("acme", "key-1")
    assert a == job_id_for("acme", "key-1")
    assert a.startswith("job-")
    assert len(a) == 24
    assert int(a[4:], 16) >= 0
    assert a != job_id_for("acme", "key-2")
    assert a != job_id_for("other", "key-1")
    # The separator keeps (tenant, key) pairs from colliding when concatenated.
    assert job_id_for("ab", "c") != job_id_for("a", "bc")
    # A stable, known value: changing the derivation would break idempotency across versions.
    assert job_id_for("default", "k") == "job-f1482505dc5d8e7e4141"
    assert JobSubmission.model_validate({"spec": spec(), "job_id": a}).job_id == a


def test_job_record_round_trip() -> None:
    rec = JobRecord(job_id=job_id_for("t", "k"), tenant="t", spec=JobSpec.model_validate(spec()))
    assert rec.state is JobState.queued
    assert rec.attempt == 0
    again = JobRecord.model_validate_json(rec.model_dump_json())
    assert again == rec


def test_job_states() -> None:
    assert {s for s in JobState if s.terminal} == {
        JobState.succeeded,
        JobState.failed,
        JobState.cancelled,
    }
    assert JobState("running") is JobState.running
    assert str(JobState.queued) == "queued"


def test_a_paused_job_has_not_ended() -> None:
    assert not JobState.paused.terminal


def test_from_checkpoint_names_a_job_and_a_step() -> None:
    source = job_id_for("t", "source")
    forked = JobSpec.model_validate(spec(from_checkpoint=f"{source}@40"))
    assert forked.from_checkpoint == f"{source}@40"
    assert not forked.from_checkpoint_optimizer
    assert parse_checkpoint_ref(f"{source}@40") == (source, 40)
    for bad in ("job-abc@x", f"{source}", f"{source}@", "bot@3", f"{source}@-1"):
        with pytest.raises(ValidationError, match="from_checkpoint"):
            JobSpec.model_validate(spec(from_checkpoint=bad))
    for bad in ("job-abc@x", source, f"{source}@", "bot@3"):
        with pytest.raises(ValueError, match="JOB_ID@STEP"):
            parse_checkpoint_ref(bad)


def test_a_job_starts_from_an_adapter_or_from_a_checkpoint_not_both() -> None:
    source = job_id_for("t", "source")
    with pytest.raises(ValidationError, match="exclude each other"):
        JobSpec.model_validate(spec(from_adapter="bot@1", from_checkpoint=f"{source}@4"))
    with pytest.raises(ValidationError, match="needs from_checkpoint"):
        JobSpec.model_validate(spec(from_checkpoint_optimizer=True))
    both = spec(from_checkpoint=f"{source}@4", from_checkpoint_optimizer=True)
    assert JobSpec.model_validate(both).from_checkpoint_optimizer

"""The OpenAI view's arithmetic, without a stack: errors, estimates, tokens, the results CSV,
names and hyperparameters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.metrics import EvalPoint, JobMetrics, TrainPoint
from swarm_gateway.fine_tuning_events import StoredEvent, trained_tokens
from swarm_gateway.fine_tuning_spec import adapter_name, resolve_hyperparameters
from swarm_gateway.fine_tuning_view import estimated_finish, job_error, status_of
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.routes.openai_files import results_csv

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = JobSpec(name="bot", base_model="tiny", dataset="ds-" + "0" * 24)


def record(**changes: object) -> JobRecord:
    return JobRecord(job_id="job-" + "1" * 20, tenant="t", spec=SPEC).model_copy(update=changes)


@pytest.mark.parametrize(
    ("reason", "code", "param"),
    [
        (
            "DatasetError: no example has any target token left",
            "invalid_training_file",
            "training_file",
        ),
        ("validation dataset ds-1 not found", "invalid_validation_file", "validation_file"),
        ("out of memory", "job_failed", None),
    ],
)
def test_a_failure_names_the_file_when_it_is_the_data(
    reason: str, code: str, param: str | None
) -> None:
    error = job_error(record(state=JobState.failed, reason=reason))
    assert error is not None
    assert (error.code, error.param, error.message) == (code, param, reason)
    assert job_error(record(state=JobState.cancelled, reason=reason)) is None


def test_the_finish_is_estimated_at_the_pace_so_far() -> None:
    running = record(
        state=JobState.running,
        assigned_at=NOW,
        updated_at=NOW + timedelta(seconds=50),
        metrics={"step": 50.0},
    )  # max_steps 200: 150 steps left at 1 s each
    assert estimated_finish(running) == int((NOW + timedelta(seconds=200)).timestamp())
    assert estimated_finish(running.model_copy(update={"state": JobState.queued})) is None
    assert estimated_finish(running.model_copy(update={"metrics": {}})) is None


def progress(step: int, tokens: int | None) -> StoredEvent:
    return StoredEvent(step, "progress", NOW, {"step": step, "tokens": tokens, "loss": 1.0})


def test_tokens_count_each_step_once() -> None:
    # Steps 3 and 4 ran twice (a resume from the checkpoint at step 2): the last report counts.
    events = [progress(s, 10 * s) for s in (1, 2, 3, 4)] + [progress(3, 31), progress(4, 41)]
    assert trained_tokens(events) == 10 + 20 + 31 + 41
    assert trained_tokens([progress(1, None)]) is None
    assert trained_tokens([]) is None


def test_results_csv_is_openais_columns() -> None:
    metrics = JobMetrics(
        job_id="job-1",
        train=[TrainPoint(step=s, loss=1.0 / s, lr=0.1, tokens_per_s=1.0) for s in (1, 2)],
        eval=[EvalPoint(step=2, eval_loss=0.25, perplexity=1.3)],
    )
    assert results_csv(metrics).decode().splitlines() == [
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy",
        "1,1.0,,,",
        "2,0.5,,0.25,",
    ]


def test_names_and_auto_hyperparameters() -> None:
    assert adapter_name("My Bot v2!", "job-ab") == "my-bot-v2"
    assert adapter_name(None, "job-ab12") == "ft-ab12"
    with pytest.raises(OpenAIError):
        adapter_name("!!!", "job-ab")
    auto = resolve_hyperparameters({}, "hyperparameters", examples=5)
    assert (auto.n_epochs, auto.batch_size, auto.learning_rate_multiplier) == (3, 5, 1.0)
    given = resolve_hyperparameters(
        {"n_epochs": 2.0, "batch_size": "auto", "learning_rate_multiplier": 2}, "h", examples=100
    )
    assert (given.n_epochs, given.batch_size, given.learning_rate_multiplier) == (2, 8, 2.0)
    for bad in ({"n_epochs": 1.5}, {"batch_size": True}, {"learning_rate_multiplier": 0}):
        with pytest.raises(OpenAIError) as refused:
            resolve_hyperparameters(bad, "h", examples=10)
        assert refused.value.param == f"h.{next(iter(bad))}"


def test_every_swarm_state_has_an_openai_status() -> None:
    assert {state: status_of(state) for state in JobState} == {
        JobState.queued: "queued",
        JobState.assigned: "running",  # placed; the worker is loading the model
        JobState.running: "running",
        JobState.paused: "paused",
        JobState.succeeded: "succeeded",
        JobState.failed: "failed",
        JobState.cancelled: "cancelled",
    }

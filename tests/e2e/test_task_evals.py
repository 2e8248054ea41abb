"""Task evals on the real stack: a job whose adapter learns a task the base model cannot do,
graded on held-out prompts at step 0 (the base) and at the end, with the results in the
record, the adapter's metrics, the events and the CLI; bad evals are refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.errors import ValidationError
from swarm_contracts.evals import EvalResult
from swarm_contracts.jobs import JobState

from .conftest import Stack, upload_ok_dataset

pytestmark = pytest.mark.slow

MARGIN = 0.5


def spec(dataset_id: str, **evals: object) -> dict:
    return {
        "name": "e2e-evals",
        "base_model": "tiny-llama",
        "dataset": dataset_id,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "training": {
            "max_steps": 16,
            "batch_size": 8,
            "lr": 1e-2,
            "warmup_steps": 2,
            "seq_len": 32,
            "eval_every": 8,
            "checkpoint_every": 16,
            "val_fraction": 0.0,
        },
        "evals": {
            "fraction": 0.2,
            "graders": [{"type": "exact_match"}, {"type": "contains"}],
            "max_new_tokens": 4,
            "samples": 3,
            "select_by": "exact_match",
        }
        | evals,
    }


def test_the_adapter_beats_the_base_on_held_out_prompts(stack: Stack, tmp_path: Path) -> None:
    client = stack.client
    dataset_id = upload_ok_dataset(stack, tmp_path)
    job = client.submit(spec(dataset_id), idempotency_key="e2e-evals")
    record = client.wait(job.job_id, timeout=300)
    assert record.state == JobState.succeeded, record.reason

    validated = [e.payload for e in client.events(job.job_id) if e.event == "validated"]
    found = [EvalResult.model_validate(p["evals"]) for p in validated]
    assert [e.step for e in found] == [0, 8, 16]
    base, tuned = found[0].metrics["exact_match"], record.metrics["exact_match"]
    assert tuned >= base + MARGIN, (base, tuned, found)
    assert found[0].examples == 13  # 20 % of the 66 rows, held out of training
    assert len(found[-1].samples) == 3
    assert found[-1].samples[0].expected == " ok"

    # The record keeps the latest evaluation; the adapter version carries the kept one's.
    assert record.evals is not None
    assert record.evals.step == 16
    adapter = client.get_adapter("e2e-evals", record.adapter.version)  # type: ignore[union-attr]
    assert adapter.lineage.metrics["exact_match"] == tuned
    assert "contains" in adapter.lineage.metrics

    result = CliRunner().invoke(
        app, ["--url", stack.local.gateway_url, "jobs", "show", job.job_id], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert f"exact_match {tuned:.2f}" in result.output
    assert "say " in result.output  # a sample row's prompt

    # The jobs list shows the kept adapter's metrics.
    result = CliRunner().invoke(
        app,
        ["--url", stack.local.gateway_url, "jobs", "ls", "--name", "e2e-evals"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert f"exact_match {tuned:.2f}" in result.output
    # Following the finished job replays its events: the live line ends with the last
    # evaluation's metrics beside the steps and the loss.
    result = CliRunner().invoke(
        app,
        ["--url", stack.local.gateway_url, "jobs", "follow", job.job_id],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    # The live line (the one with the throughput): which step it last showed depends on how
    # the progress events interleave with the end under load, the evaluation's never.
    # A console that is no terminal may print the line more than once: the last is the end.
    lines = [line for line in result.output.splitlines() if "tok/s" in line]
    assert lines, result.output
    live = lines[-1]
    assert "/16" in live, result.output
    assert f"exact_match {found[-1].metrics['exact_match']:.2f}" in live, result.output


@pytest.mark.parametrize(
    ("evals", "message"),
    [
        ({"graders": [{"type": "bleu"}]}, "does not match any of the expected tags"),
        ({"graders": [{"type": "regex", "pattern": "(oops"}]}, "invalid regular expression"),
        (
            {
                "graders": [{"type": "json_valid", "schema": {"type": 5}}],
                "select_by": "json_valid",
            },
            "not a valid JSON Schema",
        ),
        ({"max_new_tokens": 0}, "greater than or equal to 1"),
        ({"fraction": None}, "would have no rows"),  # val_fraction 0 and no validation set
    ],
)
def test_bad_evals_are_a_422_up_front(
    stack: Stack, tmp_path: Path, evals: dict, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        stack.client.submit(spec(upload_ok_dataset(stack, tmp_path), **evals))

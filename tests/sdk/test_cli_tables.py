"""Tables in a narrow terminal: ids are never cut (they are meant to be copied), the other
columns wrap to make room."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from swarm.cli import jobs as jobs_cli
from swarm.cli.output import out
from swarm_contracts.jobs import JobRecord, JobSpec, JobState

JOB = "job-0123456789abcdef01234567"
WORKER = "provider-with-a-long-name-7"


@pytest.mark.parametrize("width", [60, 80, 200])
def test_ids_survive_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    printed = io.StringIO()
    monkeypatch.setattr(out, "console", Console(file=printed, width=width, color_system=None))
    reason = "waiting: no worker has the 2 GPUs of 80 GiB this job needs, and one is cordoned"
    out.table(
        "jobs",
        ["id", "name", "state", "attempt", "worker", "created", "reason"],
        [(JOB, "support-bot", "queued", 1, WORKER, "2026-11-26 07:00:00", reason)],
    )
    text = printed.getvalue()
    assert JOB in text, text
    assert WORKER in text, text
    assert "…" not in text, text
    # What did not fit was wrapped, not dropped.
    assert "cordoned" in text.replace("\n", " ").replace("│", " "), text


def test_the_jobs_list_shows_each_jobs_task_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = io.StringIO()
    monkeypatch.setattr(out, "console", Console(file=printed, width=200, color_system=None))
    base = {"name": "bot", "base_model": "tiny", "dataset": "ds-" + "0" * 16}
    graded = JobSpec.model_validate(
        base | {"evals": {"graders": [{"type": "exact_match"}, {"type": "contains"}]}}
    )
    jobs = [
        JobRecord(
            job_id=JOB,
            tenant="t",
            spec=graded,
            state=JobState.succeeded,
            metrics={"eval_loss": 0.5, "exact_match": 0.925, "contains": 1.0},
        ),
        # A job without evals has no task metrics, whatever else its record holds.
        JobRecord(
            job_id=JOB[:-1] + "8",
            tenant="t",
            spec=JobSpec.model_validate(base),
            state=JobState.running,
            metrics={"eval_loss": 0.7, "step": 3},
        ),
    ]
    monkeypatch.setattr(jobs_cli, "client", lambda: FakeJobs(jobs))
    jobs_cli.jobs_ls(state_=None, name=None, limit=50, as_json=False)
    lines = printed.getvalue().splitlines()
    [first] = [line for line in lines if JOB in line]
    [second] = [line for line in lines if JOB[:-1] + "8" in line]
    assert "exact_match 0.93  contains 1.00" in first, printed.getvalue()
    assert "exact_match" not in second
    assert "0.70" not in second


class FakeJobs:
    """The one client call `swarm jobs ls` makes, answering with the given records."""

    def __init__(self, records: list[JobRecord]) -> None:
        self.records = records

    def list_jobs(self, **_: object) -> tuple[list[JobRecord], None]:
        return self.records, None

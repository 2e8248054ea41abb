"""Tables in a narrow terminal: ids are never cut (they are meant to be copied), the other
columns wrap to make room."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from swarm.cli.output import out

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

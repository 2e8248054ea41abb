"""The short chaos run (``chaos.py``): a few jobs by HTTP and raw NATS over two trainers and
two schedulers while one of each fault hits them (kill -9 a trainer, kill -9 the scheduler
leader, freeze a trainer past its lease, restart nats-server, stop S3 for 10 s, fill a
trainer's work disk), overlapping. Whatever the timing, the invariants of ``invariants.py``
hold at the end, and no service needed a hand. The long soak is ``python -m tests.soak.chaos``
(docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .chaos import Plan, run

# Real processes, each trainer with its own Ray cluster: beside another such test on a loaded
# two-core machine one can take longer than the suite's 600 s per test; its own waits bound it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_one_of_each_fault_breaks_no_invariant(tmp_path: Path) -> None:
    report = run(Plan(jobs=3, steps=24, seed=16), tmp_path, on_progress=lambda line: None)
    logs = "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
        for p in sorted((tmp_path / "logs").glob("*.log"))
    )
    assert not report.violations, report.table() + "\n" + logs
    assert all(f.start is not None for f in report.faults), report.table()

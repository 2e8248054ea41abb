"""A job's task evals in the terminal (``swarm jobs show``): each metric, then the sample of
graded rows (prompt, expected, got)."""

from __future__ import annotations

from rich.table import Table

from swarm_contracts.jobs import JobRecord


def _cell(text: str, width: int = 60) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def evals_table(record: JobRecord) -> Table | None:
    """None for a job without task evals, or before its first evaluation."""
    evals = record.evals
    if evals is None:
        return None
    metrics = record.spec.evals.metrics if record.spec.evals else list(evals.metrics)
    # A finished job's record holds the kept adapter's metrics; the sample is the latest's.
    shown = "  ".join(
        f"{m} {record.metrics.get(m, evals.metrics.get(m, 0.0)):.2f}" for m in metrics
    )
    table = Table(
        title=f"task evals: {shown} ({evals.examples} held-out rows; sample at step {evals.step})"
    )
    table.add_column("prompt")
    table.add_column("expected")
    table.add_column("got")
    for metric in metrics:
        table.add_column(metric, justify="center")
    for row in evals.samples:
        marks = [
            ("✓" if row.scores.get(m) else "✗") + (f" ({row.errors[m]})" if m in row.errors else "")
            for m in metrics
        ]
        table.add_row(_cell(row.prompt), _cell(row.expected, 30), _cell(row.got, 30), *marks)
    return table

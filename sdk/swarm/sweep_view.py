"""A sweep in the terminal: its trials as a table, live while it runs (``swarm sweep run -f``)."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from swarm.client import Client
from swarm_contracts.sweeps import SweepDetail, TrialRecord, TrialState

STATE_STYLE = {
    TrialState.pending: "dim",
    TrialState.queued: "yellow",
    TrialState.running: "blue",
    TrialState.succeeded: "green",
    TrialState.pruned: "magenta",
    TrialState.failed: "red",
    TrialState.cancelled: "dim",
}


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def last_eval(trial: TrialRecord) -> str:
    if not trial.evals:
        return ""
    step = max(trial.evals)
    return f"{trial.evals[step]:.4g} @{step}"


def trials_table(sweep: SweepDetail) -> Table:
    spec = sweep.spec
    best = sweep.best.trial if sweep.best else None
    done = sum(1 for t in sweep.trials if t.state.terminal)
    title = (
        f"{sweep.sweep_id} · {spec.name} · {spec.algorithm} · {sweep.state.value} · "
        f"{done}/{spec.trials} trials"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for path in spec.search:
        table.add_column(path)
    table.add_column(f"last {spec.metric}", justify="right")
    table.add_column(spec.metric, justify="right")
    table.add_column("job", no_wrap=True)
    for trial in sweep.trials:
        state = Text(trial.state.value, style=STATE_STYLE.get(trial.state, ""))
        if trial.pruned_at_step is not None:
            state.append(f" @{trial.pruned_at_step}")
        marker = " ★" if trial.trial == best else ""
        table.add_row(
            f"{trial.trial}{marker}",
            state,
            *(fmt(trial.params.get(path)) for path in spec.search),
            last_eval(trial),
            fmt(trial.value),
            trial.job_id,
        )
    return table


def summary(sweep: SweepDetail) -> Text:
    if sweep.best is None:
        reason = f": {sweep.reason}" if sweep.reason else ""
        return Text(f"{sweep.state.value}{reason}", style="bold red")
    best = sweep.best
    adapter = f"{best.adapter.name} v{best.adapter.version}" if best.adapter else "no adapter"
    params = ", ".join(f"{k}={fmt(v)}" for k, v in best.params.items())
    line = Text(f"best: trial {best.trial}, {sweep.spec.metric} {best.value:.4g} ({params}); ")
    line.append(adapter)
    if sweep.state == "completed":
        line.append(f", alias {sweep.spec.name}@best")
    if sweep.reason:
        line.append(f" ({sweep.reason})", style="yellow")
    return line


def follow_sweep(
    client: Client, sweep_id: str, console: Console, poll_s: float = 1.0
) -> SweepDetail:
    """Show the trials table, redrawn every ``poll_s`` until the sweep ends; return it."""
    sweep = client.get_sweep(sweep_id)
    with Live(trials_table(sweep), console=console, refresh_per_second=4) as live:
        while not sweep.state.terminal:
            time.sleep(poll_s)
            sweep = client.get_sweep(sweep_id)
            live.update(Group(trials_table(sweep), summary(sweep)))
        live.update(trials_table(sweep))
    return sweep

"""``swarm sweep run`` and ``swarm sweeps``: start, list, show, follow and cancel
hyperparameter sweeps, and print their events."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from swarm.cli.output import AfterOpt, JsonOpt, lists_by_default, out
from swarm.cli.session import client, load_spec, run

run_group = typer.Typer(help="Run a hyperparameter sweep: `swarm sweep run sweep.yaml --follow`.")
group = typer.Typer(help="List, show, cancel and follow sweeps (plain `swarm sweeps` lists).")


def sweep_ended(sweep: Any) -> int:
    """Print how a followed sweep ended; its exit code (1 unless it completed)."""
    from swarm.sweep_view import summary

    out.console.print(summary(sweep))
    return 0 if sweep.state == "completed" else 1


@run_group.command("run")
def sweep_run(
    file: Annotated[Path, typer.Argument(help="sweep spec (YAML)", exists=True, dir_okay=False)],
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="show the trials live until done")
    ] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="dedupe retried runs")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a sweep; with --follow, show its trials until it ends (exit 1 unless completed)."""
    from swarm.sweep_view import follow_sweep

    c = client()
    record = run(lambda: c.create_sweep(load_spec(file), idempotency_key=idempotency_key))
    if as_json and not follow_:
        out.json(record)
        return
    spec = record.spec
    out.console.print(
        f"sweep [bold]{record.sweep_id}[/] ({spec.name}): {spec.trials} trials, "
        f"{spec.algorithm}, {spec.max_concurrent} at a time"
    )
    if follow_:
        done = run(lambda: follow_sweep(c, record.sweep_id, out.console))
        if as_json:
            out.json(done)
        raise typer.Exit(sweep_ended(done))


@group.command("ls")
@lists_by_default(group)
def sweeps_ls(
    state_: Annotated[
        str | None, typer.Option("--state", help="running, completed, failed, cancelled")
    ] = None,
    name: Annotated[str | None, typer.Option(help="sweep (adapter) name")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List your sweeps, newest first."""
    out.listing(
        run(lambda: client().list_sweeps(state=state_, name=name, limit=limit)),
        as_json,
        "sweeps",
        ["id", "name", "state", "algorithm", "budget", "best", "created"],
        lambda s: (
            s.sweep_id,
            s.spec.name,
            s.state,
            s.spec.algorithm,
            s.spec.budget,
            f"{s.best.value:.4g} (trial {s.best.trial})" if s.best else None,
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        ),
    )


@group.command("show")
def sweeps_show(
    sweep_id: str,
    plot: Annotated[
        Path | None,
        typer.Option(help="write the metric against each parameter (scatter plots) to this PNG"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a sweep and its trials table (and plot them with --plot out.png)."""
    from swarm.sweep_view import summary, trials_table

    sweep = run(lambda: client().get_sweep(sweep_id))
    if plot is not None:
        from swarm.plot import write_sweep_png

        run(lambda: write_sweep_png(sweep, plot))
        out.err.print(f"scatter plots written to {plot}")
    if as_json:
        out.json(sweep)
        return
    out.console.print(trials_table(sweep))
    out.console.print(summary(sweep))


@group.command("follow")
def sweeps_follow(sweep_id: str) -> None:
    """Show a sweep's trials live until it ends."""
    from swarm.sweep_view import follow_sweep

    c = client()
    raise typer.Exit(sweep_ended(run(lambda: follow_sweep(c, sweep_id, out.console))))


@group.command("events")
def sweeps_events(sweep_id: str, after: AfterOpt = None, as_json: JsonOpt = False) -> None:
    """Print a sweep's events (history, then live) until it ends; --json prints CloudEvents."""
    run(lambda: out.events(client().sweep_events(sweep_id, last_event_id=after), as_json))


@group.command("cancel")
def sweeps_cancel(sweep_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a sweep: no new trial starts, and every trial in flight is cancelled."""
    record = run(lambda: client().cancel_sweep(sweep_id))
    out.result(record, as_json, f"cancel requested for {record.sweep_id} (was {record.state})")

"""``swarm submit`` and ``swarm jobs``: submit, list, estimate, show, follow, cancel, pause,
resume and verify jobs, and print their events."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from swarm.cli.output import AfterOpt, JsonOpt, lists_by_default, out
from swarm.cli.session import client, load_spec, run
from swarm.evals_view import evals_table
from swarm.progress import follow, report, task_metrics
from swarm_contracts.jobs import JobRecord

group = typer.Typer(
    help="List, show, cancel, pause, resume, verify and follow jobs (plain `swarm jobs` lists)."
)

SpecArg = Annotated[Path, typer.Argument(help="job spec (YAML)", exists=True, dir_okay=False)]


def submit(
    file: SpecArg,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="show progress until done")
    ] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="dedupe retried submits")] = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            help="JOB_ID@STEP: start from that committed checkpoint of another of your jobs "
            "(a fork: its adapter weights)"
        ),
    ] = None,
    with_optimizer: Annotated[
        bool,
        typer.Option(
            help="with --from-checkpoint: also its optimizer state, schedule, step and data "
            "position, so the job continues that run"
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job; with --follow, show its progress and exit 1 if it fails."""
    if with_optimizer and from_checkpoint is None:
        out.fail("[red]--with-optimizer needs --from-checkpoint JOB_ID@STEP[/]")
    c = client()
    spec = load_spec(file)
    record = run(
        lambda: c.submit(
            spec,
            idempotency_key=idempotency_key,
            from_checkpoint=from_checkpoint,
            from_checkpoint_optimizer=with_optimizer,
        )
    )
    if as_json and not follow_:
        out.json(record)
        return
    out.console.print(f"submitted [bold]{record.job_id}[/] ({record.spec.name}, {record.state})")
    if record.parent is not None:
        lora = record.spec.lora
        out.console.print(
            f"continues from {record.parent.ref} (its LoRA: r={lora.r}, alpha={lora.alpha:g}, "
            f"target_modules={lora.target_modules})"
        )
    if record.spec.from_checkpoint is not None:
        what = "its whole training state" if record.spec.from_checkpoint_optimizer else "weights"
        out.console.print(f"forks {record.spec.from_checkpoint} ({what})")
    if follow_:
        result = run(lambda: follow(c, record.job_id, out.console))
        if as_json:
            out.json(result.record)
        raise typer.Exit(report(result, out.console))


@group.command("ls")
@lists_by_default(group)
def jobs_ls(
    state_: Annotated[str | None, typer.Option("--state", help="queued, running, ...")] = None,
    name: Annotated[str | None, typer.Option(help="adapter name")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List your jobs, newest first."""
    records, _ = run(lambda: client().list_jobs(state=state_, name=name, limit=limit))
    out.listing(
        records,
        as_json,
        "jobs",
        ["id", "name", "state", "attempt", "worker", "created", "task evals", "reason"],
        job_row,
    )


def job_row(r: JobRecord) -> tuple[object, ...]:
    return (
        r.job_id,
        r.spec.name,
        r.state,
        r.attempt,
        r.worker_id,
        r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        listed_task_metrics(r),
        r.reason,
    )


def listed_task_metrics(record: JobRecord) -> str:
    """The job's task metrics as its record holds them (the kept adapter's, once it ended)."""
    names = record.spec.evals.metrics if record.spec.evals else []
    return task_metrics({m: record.metrics[m] for m in names if m in record.metrics})


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@group.command("estimate")
def jobs_estimate(file: SpecArg, as_json: JsonOpt = False) -> None:
    """Estimate the memory a job would need, by term (nothing is submitted): per GPU for a
    GPU job, per worker (host memory, fp32) for a CPU-only one.

    A GPU job is placed only on GPUs with at least this much memory."""
    estimate = run(lambda: client().estimate(load_spec(file)))
    if as_json:
        out.json(estimate)
        return
    on_gpu = estimate.device == "gpu"
    what = "GPU memory per GPU" if on_gpu else "host memory per CPU worker (fp32)"
    rows = [
        ("weights", gib(estimate.weights_bytes)),
        (f"LoRA + AdamW ({estimate.lora_parameters:,} params)", gib(estimate.lora_bytes)),
        ("activations", gib(estimate.activations_bytes)),
        ("logits", gib(estimate.logits_bytes)),
    ]
    if on_gpu:
        rows.append(("CUDA runtime", gib(estimate.runtime_bytes)))
    rows.append(("total per GPU" if on_gpu else "total per worker", gib(estimate.total_bytes)))
    # Above the table, not its title: a title wraps at the table's (narrow) width.
    out.console.print(
        f"{what} of {file.name} on {estimate.base_model} ({estimate.tokens:,} tokens a micro-batch)"
    )
    out.table("", ["term", "memory"], rows)


@group.command("show")
def jobs_show(
    job_id: str,
    plot: Annotated[
        Path | None, typer.Option(help="write the loss and eval-loss curves to this PNG")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one job's record (and plot its losses with --plot out.png)."""
    c = client()
    record = run(lambda: c.get_job(job_id))
    if plot is not None:
        from swarm.plot import loss_curves, write_png

        run(lambda: write_png(loss_curves(c, job_id), plot, f"{job_id} ({record.spec.name})"))
        out.err.print(f"loss curves written to {plot}")
    if as_json:
        out.json(record)
        return
    out.console.print(yaml.safe_dump(record.model_dump(mode="json"), sort_keys=False))
    evals = evals_table(record)
    if evals is not None:
        out.console.print(evals)


@group.command("events")
def jobs_events(job_id: str, after: AfterOpt = None, as_json: JsonOpt = False) -> None:
    """Print a job's events (history, then live) until it ends; --json prints CloudEvents."""
    run(lambda: out.events(client().events(job_id, last_event_id=after), as_json))


@group.command("cancel")
def jobs_cancel(job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a job in any state."""
    record = run(lambda: client().cancel(job_id))
    out.result(record, as_json, f"cancel requested for {record.job_id} (was {record.state})")


ReasonOpt = Annotated[str | None, typer.Option(help="why (in the job's events)")]


@group.command("pause")
def jobs_pause(
    job_id: str,
    reason: ReasonOpt = None,
    wait: Annotated[
        bool, typer.Option(help="until it is paused; exit 1 if it ended instead")
    ] = False,
    timeout: Annotated[float, typer.Option(help="with --wait: give up after (seconds)")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Pause a running job: its worker checkpoints it and lets it go, and it holds no worker
    until `swarm jobs resume`."""
    c = client()
    record = run(lambda: c.pause_job(job_id, reason))
    if not wait:
        out.result(record, as_json, f"pause requested for {record.job_id} (was {record.state})")
        return
    out.err.print(f"pause requested for {job_id}: waiting for its checkpoint")
    record = run(lambda: c.wait_state(job_id, "paused", timeout=timeout))
    if record.state == "paused":
        out.result(record, as_json, f"{job_id} {record.reason or 'paused'}")
        return
    if as_json:
        out.json(record)
    why = f": {record.reason}" if record.reason else ""
    out.fail(f"[red]{job_id} {record.state} instead of pausing[/]{why}", code=1)


@group.command("resume")
def jobs_resume(job_id: str, reason: ReasonOpt = None, as_json: JsonOpt = False) -> None:
    """Queue a paused job again: it trains on from the checkpoint it was paused at."""
    record = run(lambda: client().resume_job(job_id, reason))
    out.result(record, as_json, f"resume requested for {record.job_id}")


@group.command("verify")
def jobs_verify(job_id: str, as_json: JsonOpt = False) -> None:
    """Replay part of a succeeded job on another worker and compare (see its `verified` event)."""
    record = run(lambda: client().verify_job(job_id))
    out.result(record, as_json, f"verification requested for {record.job_id}")


@group.command("follow")
def jobs_follow(job_id: str) -> None:
    """Show a job's progress until it ends."""
    c = client()
    raise typer.Exit(report(run(lambda: follow(c, job_id, out.console)), out.console))

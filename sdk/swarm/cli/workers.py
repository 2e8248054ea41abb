"""``swarm workers``: list the trainer workers; cordon, uncordon, drain, clear and benchmark
one."""

from __future__ import annotations

from typing import Annotated

import typer

from swarm.cli.output import JsonOpt, out
from swarm.cli.session import client, run
from swarm_contracts.workers import WorkerBenchmark, WorkerInfo, WorkerOps

group = typer.Typer(
    help="Trainer workers (plain `swarm workers` lists): cordon, uncordon, drain, clear, benchmark."
)

ReasonOpt = Annotated[str, typer.Option(help="why, shown to other operators")]


def worker_state(w: WorkerInfo) -> str:
    """``alive``, plus what an operator asked (``alive, draining`` / ``alive, cordoned``) and
    what the scheduler noticed (``alive, slow``; ``alive, suspect``: a verification caught it)."""
    state = w.state
    if w.draining:
        state = f"{w.state}, {'drained' if not w.running else 'draining'}"
    elif w.cordoned and not w.suspect:
        state = f"{w.state}, cordoned"
    return ", ".join([state, *(["suspect"] if w.suspect else []), *w.flags])


def speed(b: WorkerBenchmark | None) -> str:
    """A worker's self-benchmark in a cell: ``652 TFLOP/s, 48,210 tok/s``."""
    if b is None:
        return "-"
    busy = " (busy)" if b.busy else ""
    return f"{b.matmul_tflops:.3g} TFLOP/s, {b.train_tokens_per_s:,.0f} tok/s{busy}"


@group.callback(invoke_without_command=True)
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the workers the scheduler knows."""
    if ctx.invoked_subcommand is not None:
        return
    out.listing(
        run(lambda: client().workers()),
        as_json,
        "workers",
        [
            "id",
            "provider",
            "state",
            "cpus free/total",
            "gpus free/total",
            "speed",
            "running",
            "last heartbeat",
        ],
        lambda w: (
            w.worker_id,
            w.provider or "",
            worker_state(w),
            f"{w.free.cpus}/{w.resources.cpus}",
            f"{len(w.free.gpus)}/{len(w.resources.gpus)}",
            speed(w.benchmark),
            ", ".join(r.job_id for r in w.running),
            w.last_heartbeat.strftime("%H:%M:%S"),
        ),
    )


def ops_done(ops: WorkerOps, as_json: bool, what: str) -> None:
    out.result(ops, as_json, f"worker {ops.worker_id} {what}")


@group.command("cordon")
def workers_cordon(worker_id: str, reason: ReasonOpt = "", as_json: JsonOpt = False) -> None:
    """No new jobs on WORKER_ID; its running jobs go on (until `uncordon`)."""
    ops_done(run(lambda: client().cordon_worker(worker_id, reason)), as_json, "cordoned")


@group.command("uncordon")
def workers_uncordon(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID takes jobs again (ends a cordon or a drain)."""
    ops_done(run(lambda: client().uncordon_worker(worker_id)), as_json, "schedulable again")


@group.command("clear")
def workers_clear(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID is no longer suspect (a replay of its work did not match); it takes jobs again
    unless cordoned or drained."""
    ops_done(run(lambda: client().clear_worker(worker_id)), as_json, "cleared")


@group.command("drain")
def workers_drain(
    worker_id: str,
    move: Annotated[
        bool,
        typer.Option(
            "--move", help="checkpoint its running jobs now and resume them on other workers"
        ),
    ] = False,
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """No new jobs on WORKER_ID; its running jobs finish there (or, with --move, move)."""
    ops = run(lambda: client().drain_worker(worker_id, move_jobs=move, reason=reason))
    what = "draining: its jobs are being moved" if move else "draining: its jobs finish there"
    ops_done(ops, as_json, what)


@group.command("benchmark")
def workers_benchmark(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID measures its speed again now (a matmul and LoRA training steps)."""
    result = run(lambda: client().benchmark_worker(worker_id))
    out.result(
        result,
        as_json,
        f"worker {worker_id}: {speed(result)} ({result.dtype} on {result.device}, "
        f"measured in {result.duration_s:.1f} s)",
    )

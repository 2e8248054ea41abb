"""The ``swarm`` command line: local stack, demo, jobs, sweeps, datasets, models, adapters,
workers, chat."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from swarm.client import Client, SwarmError
from swarm.completions import as_messages
from swarm.evals_view import evals_table
from swarm.progress import follow, report
from swarm.sse import JobStreamEvent
from swarm.tiny_model import create_tiny_model
from swarm_contracts.workers import WorkerBenchmark, WorkerInfo, WorkerOps

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")

app = typer.Typer(help="Swarm: decentralized LoRA fine-tuning.", no_args_is_help=True)
jobs_app = typer.Typer(
    help="List, show, cancel, verify and follow jobs (plain `swarm jobs` lists)."
)
models_app = typer.Typer(help="Base models in the registry (plain `swarm models` lists).")
datasets_app = typer.Typer(help="Uploaded datasets (plain `swarm datasets` lists).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(models_app, name="models")
app.add_typer(datasets_app, name="datasets")
adapters_app = typer.Typer(help="Registered adapters (plain `swarm adapters` lists).")
app.add_typer(adapters_app, name="adapters")
sweep_app = typer.Typer(help="Run a hyperparameter sweep: `swarm sweep run sweep.yaml --follow`.")
sweeps_app = typer.Typer(help="List, show, cancel and follow sweeps (plain `swarm sweeps` lists).")
app.add_typer(sweep_app, name="sweep")
app.add_typer(sweeps_app, name="sweeps")

console = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON output")]
AfterOpt = Annotated[str | None, typer.Option("--after", help="only events after this event id")]


class State:
    url: str | None = None
    api_key: str | None = None


state = State()


@app.callback()
def main(
    url: Annotated[
        str | None, typer.Option("--url", envvar="SWARM_GATEWAY_URL", help="gateway URL")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="SWARM_API_KEY", help="API key")
    ] = None,
) -> None:
    """Options win over SWARM_GATEWAY_URL/SWARM_API_KEY, which win over
    ~/.config/swarm/config.toml (gateway_url, api_key)."""
    state.url = url
    state.api_key = api_key


def client() -> Client:
    try:
        return Client(base_url=state.url, api_key=state.api_key)
    except ValueError as exc:  # an unreadable config file
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


def run(action: Callable[[], Any]) -> Any:
    """Turn SDK errors into a one-line message and exit code 2, not a traceback."""
    try:
        return action()
    except SwarmError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    except TimeoutError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


def dump(data: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        obj: Any = data.model_dump(mode="json")
    elif isinstance(data, dict):
        obj = data
    else:
        obj = [d.model_dump(mode="json") for d in data]
    # Plain print: rich would wrap and colour the JSON, which breaks pipes into jq.
    print(json.dumps(obj, indent=2))


def listing(
    found: Sequence[T],
    as_json: bool,
    title: str,
    columns: Sequence[str],
    row: Callable[[T], Sequence[Any]],
) -> None:
    """A list command's output: JSON for scripts, else a table with one row per item."""
    if as_json:
        dump(found)
    else:
        table(title, columns, [row(item) for item in found])


# Columns whose values are meant to be copied whole (ids, names, keys).
ID_COLUMNS = frozenset({"id", "name", "job", "worker", "public key"})
# The narrowest a wrapped column may get before a table reads better as one block per row.
WRAPPED_MIN = 8


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table that never cuts an id, however narrow the terminal: an id column is as wide
    as its longest value and never wraps, the other columns wrap to make room; where even
    that does not fit, each row is printed as a block of ``column: value`` lines."""
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    is_id = [i == 0 or c in ID_COLUMNS for i, c in enumerate(columns)]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    needed = sum(
        w if ident else min(w, WRAPPED_MIN) for w, ident in zip(widths, is_id, strict=True)
    )
    if needed + 3 * len(columns) + 1 > console.width:
        if title:
            console.print(f"[bold]{title}[/]")
        for r in cells:
            console.print(r[0], markup=False)
            for c, v in zip(columns[1:], r[1:], strict=True):
                if v:
                    console.print(f"  {c}: {v}", markup=False, soft_wrap=False)
        return
    t = Table(title=title)
    for c, ident, w in zip(columns, is_id, widths, strict=True):
        if ident:
            t.add_column(c, no_wrap=True, min_width=w)
        else:
            t.add_column(c, overflow="fold", min_width=min(w, WRAPPED_MIN))
    for r in cells:
        t.add_row(*r)
    console.print(t)


# --- local stack & demo -------------------------------------------------------------------


@app.command()
def up(
    root: Annotated[Path, typer.Option(help="state directory")] = Path(".swarm"),
) -> None:
    """Run nats-server and Swarm's services (inference and sweeps included) locally until Ctrl-C."""
    from swarm.local_stack import LocalStack, StackError

    try:
        # A NATS already on the address is used only when named on purpose.
        reuse = "SWARM_NATS_URL" in os.environ
        code = LocalStack(root, console=err, reuse_nats=reuse).run_forever()
    except StackError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command()
def demo(
    steps: Annotated[int, typer.Option(help="training steps")] = 400,
    root: Annotated[Path, typer.Option(help="state directory for a temporary stack")] = Path(
        ".swarm/demo"
    ),
) -> None:
    """Train a LoRA adapter on a tiny model end to end, starting a local stack if needed."""
    from swarm.demo import run_demo

    raise typer.Exit(run_demo(state.url, state.api_key, steps=steps, root=root, console=console))


# --- jobs ---------------------------------------------------------------------------------


def load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        err.print(f"[red]cannot read {path}:[/] {exc}")
        raise typer.Exit(2) from None
    if not isinstance(spec, dict):
        err.print(f"[red]{path} must hold a YAML (or JSON) mapping: a job or sweep spec[/]")
        raise typer.Exit(2)
    return spec


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="job spec (YAML)", exists=True, dir_okay=False)],
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="show progress until done")
    ] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="dedupe retried submits")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job; with --follow, show its progress and exit 1 if it fails."""
    c = client()
    record = run(lambda: c.submit(load_spec(file), idempotency_key=idempotency_key))
    if as_json and not follow_:
        dump(record)
        return
    console.print(f"submitted [bold]{record.job_id}[/] ({record.spec.name}, {record.state})")
    if record.parent is not None:
        lora = record.spec.lora
        console.print(
            f"continues from {record.parent.ref} (its LoRA: r={lora.r}, alpha={lora.alpha:g}, "
            f"target_modules={lora.target_modules})"
        )
    if follow_:
        result = run(lambda: follow(c, record.job_id, console))
        if as_json:
            dump(result.record)
        raise typer.Exit(report(result, console))


def jobs_table(records: Sequence[Any]) -> None:
    table(
        "jobs",
        ["id", "name", "state", "attempt", "worker", "created", "reason"],
        [
            (
                r.job_id,
                r.spec.name,
                r.state,
                r.attempt,
                r.worker_id,
                r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                r.reason,
            )
            for r in records
        ],
    )


@jobs_app.callback(invoke_without_command=True)
def jobs_default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is None:
        jobs_ls(as_json=as_json)


@jobs_app.command("ls")
def jobs_ls(
    state_: Annotated[str | None, typer.Option("--state", help="queued, running, ...")] = None,
    name: Annotated[str | None, typer.Option(help="adapter name")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List your jobs, newest first."""
    records, _ = run(lambda: client().list_jobs(state=state_, name=name, limit=limit))
    if as_json:
        dump(records)
    else:
        jobs_table(records)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@jobs_app.command("estimate")
def jobs_estimate(
    file: Annotated[Path, typer.Argument(help="job spec (YAML)", exists=True, dir_okay=False)],
    as_json: JsonOpt = False,
) -> None:
    """Estimate the memory a job would need, by term (nothing is submitted): per GPU for a
    GPU job, per worker (host memory, fp32) for a CPU-only one.

    A GPU job is placed only on GPUs with at least this much memory."""
    estimate = run(lambda: client().estimate(load_spec(file)))
    if as_json:
        dump(estimate)
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
    console.print(
        f"{what} of {file.name} on {estimate.base_model} ({estimate.tokens:,} tokens a micro-batch)"
    )
    table("", ["term", "memory"], rows)


@jobs_app.command("show")
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
        err.print(f"loss curves written to {plot}")
    if as_json:
        dump(record)
        return
    console.print(yaml.safe_dump(record.model_dump(mode="json"), sort_keys=False))
    table = evals_table(record)
    if table is not None:
        console.print(table)


def event_line(ev: JobStreamEvent) -> str:
    hidden = ("event", "job_id", "sweep_id", "spec")
    fields = {k: v for k, v in ev.payload.items() if k not in hidden}
    return f"{ev.id:>6} {ev.event:<10} " + " ".join(f"{k}={v}" for k, v in fields.items())


def print_events(events: Callable[[], Iterator[JobStreamEvent]], as_json: bool) -> None:
    def stream() -> None:
        for ev in events():
            if as_json:
                # One JSON object per line (JSON Lines), so that a pipe sees each at once: the
                # CloudEvent plus "seq", the id to resume after (--after).
                print(json.dumps({**ev.data, "seq": ev.id}), flush=True)
            else:
                console.print(event_line(ev), highlight=False, markup=False)

    run(stream)


@jobs_app.command("events")
def jobs_events(job_id: str, after: AfterOpt = None, as_json: JsonOpt = False) -> None:
    """Print a job's events (history, then live) until it ends; --json prints CloudEvents."""
    print_events(lambda: client().events(job_id, last_event_id=after), as_json)


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a job in any state."""
    record = run(lambda: client().cancel(job_id))
    if as_json:
        dump(record)
    else:
        console.print(f"cancel requested for {record.job_id} (was {record.state})")


@jobs_app.command("verify")
def jobs_verify(job_id: str, as_json: JsonOpt = False) -> None:
    """Replay part of a succeeded job on another worker and compare (see its `verified` event)."""
    record = run(lambda: client().verify_job(job_id))
    if as_json:
        dump(record)
    else:
        console.print(f"verification requested for {record.job_id}")


@jobs_app.command("follow")
def jobs_follow(job_id: str) -> None:
    """Show a job's progress until it ends."""
    c = client()
    raise typer.Exit(report(run(lambda: follow(c, job_id, console)), console))


# --- sweeps -------------------------------------------------------------------------------


def sweep_ended(sweep: Any) -> int:
    """Print how a followed sweep ended; its exit code (1 unless it completed)."""
    from swarm.sweep_view import summary

    console.print(summary(sweep))
    return 0 if sweep.state == "completed" else 1


@sweep_app.command("run")
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
        dump(record)
        return
    spec = record.spec
    console.print(
        f"sweep [bold]{record.sweep_id}[/] ({spec.name}): {spec.trials} trials, "
        f"{spec.algorithm}, {spec.max_concurrent} at a time"
    )
    if follow_:
        done = run(lambda: follow_sweep(c, record.sweep_id, console))
        if as_json:
            dump(done)
        raise typer.Exit(sweep_ended(done))


@sweeps_app.callback(invoke_without_command=True)
def sweeps_default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is None:
        sweeps_ls(as_json=as_json)


@sweeps_app.command("ls")
def sweeps_ls(
    state_: Annotated[
        str | None, typer.Option("--state", help="running, completed, failed, cancelled")
    ] = None,
    name: Annotated[str | None, typer.Option(help="sweep (adapter) name")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List your sweeps, newest first."""
    listing(
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


@sweeps_app.command("show")
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
        err.print(f"scatter plots written to {plot}")
    if as_json:
        dump(sweep)
        return
    console.print(trials_table(sweep))
    console.print(summary(sweep))


@sweeps_app.command("follow")
def sweeps_follow(sweep_id: str) -> None:
    """Show a sweep's trials live until it ends."""
    from swarm.sweep_view import follow_sweep

    c = client()
    raise typer.Exit(sweep_ended(run(lambda: follow_sweep(c, sweep_id, console))))


@sweeps_app.command("events")
def sweeps_events(sweep_id: str, after: AfterOpt = None, as_json: JsonOpt = False) -> None:
    """Print a sweep's events (history, then live) until it ends; --json prints CloudEvents."""
    print_events(lambda: client().sweep_events(sweep_id, last_event_id=after), as_json)


@sweeps_app.command("cancel")
def sweeps_cancel(sweep_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a sweep: no new trial starts, and every trial in flight is cancelled."""
    record = run(lambda: client().cancel_sweep(sweep_id))
    if as_json:
        dump(record)
    else:
        console.print(f"cancel requested for {record.sweep_id} (was {record.state})")


# --- adapters, workers --------------------------------------------------------------------


def adapters_table(found: Sequence[Any]) -> None:
    table(
        "adapters",
        ["name", "version", "base model", "job", "eval loss", "created", "quarantined"],
        [
            (
                a.name,
                a.version,
                f"{a.lineage.base_model}@{a.lineage.base_model_version}",
                a.lineage.job_id,
                a.lineage.metrics.get("eval_loss"),
                a.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                a.quarantine.reason[:60] if a.quarantine else "",
            )
            for a in found
        ],
    )


@adapters_app.callback(invoke_without_command=True)
def adapters_default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is None:
        adapters_ls(as_json=as_json)


@adapters_app.command("ls")
def adapters_ls(
    name: Annotated[str | None, typer.Option(help="only this adapter")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List your registered adapters."""
    found = run(lambda: client().list_adapters(name))
    if as_json:
        dump(found)
    else:
        adapters_table(found)


REF_HELP = "NAME (the latest), NAME@VERSION or NAME@ALIAS"


@adapters_app.command("show")
def adapters_show(
    ref: Annotated[str, typer.Argument(help=REF_HELP)],
    as_json: JsonOpt = False,
) -> None:
    """Show an adapter version with its lineage."""
    found = run(lambda: client().resolve_adapter(ref))
    if as_json:
        dump(found)
        return
    console.print(yaml.safe_dump(found.model_dump(mode="json"), sort_keys=False))


@adapters_app.command("pull")
def adapters_pull(
    ref: Annotated[str, typer.Argument(help=REF_HELP)],
    out: Annotated[Path | None, typer.Option(help="directory; default ./NAME-vVERSION")] = None,
    with_base: Annotated[
        bool,
        typer.Option(
            "--with-base",
            help="also fetch the base model into OUT/base and point adapter_config.json at it, "
            "so that AutoPeftModelForCausalLM.from_pretrained(OUT) loads it offline",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Download an adapter's PEFT files (adapter_config.json, adapter_model.safetensors)."""
    c = client()
    found = run(lambda: c.resolve_adapter(ref))
    name, version = found.name, found.version
    dest = out or Path(f"{name}-v{version}")
    pull = c.pull_adapter_with_base if with_base else c.download_adapter
    files = run(lambda: pull(name, version, dest))
    if as_json:
        dump({"name": name, "version": version, "files": [str(f) for f in files]})
    else:
        console.print(f"{name} v{version}: {len(files)} files in {dest}")


@adapters_app.command("export")
def adapters_export(
    ref: Annotated[str, typer.Argument(help=REF_HELP)],
    download: Annotated[
        Path | None, typer.Option(help="then fetch the merged model into this directory")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Merge an adapter into its base model (a from_pretrained model in the store)."""
    c = client()
    found = run(lambda: c.resolve_adapter(ref))
    name, version = found.name, found.version
    with console.status(f"merging {name} v{version} into its base model…"):
        result = run(lambda: c.export_adapter(name, version))
    if download is not None:
        with console.status(f"downloading the merged model to {download}…"):
            run(lambda: c.download_export(name, version, download))
    if as_json:
        dump(result)
    else:
        console.print(f"{result.adapter} merged into {result.base_model}: {result.store_key}")
        if download is not None:
            console.print(f"merged model in {download} (from_pretrained loads it)")


@adapters_app.command("unquarantine")
def adapters_unquarantine(
    name: str,
    version: int,
    tenant: Annotated[str | None, typer.Option(help="the version's tenant")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Admins: release a version its job's failed verification quarantined."""
    found = run(lambda: client().unquarantine_adapter(name, version, tenant))
    if as_json:
        dump(found)
    else:
        console.print(f"{name}@{version} ({found.tenant}) is out of quarantine")


@adapters_app.command("alias")
def adapters_alias(
    name: str,
    alias: str,
    version: Annotated[int | None, typer.Argument(help="set the alias to this version")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show an alias (e.g. `prod`) of an adapter, or point it at VERSION."""
    c = client()
    if version is None:
        found = run(lambda: c.get_alias(name, alias))
    else:
        found = run(lambda: c.set_alias(name, alias, version))
    if as_json:
        dump(found)
    else:
        target = found.get("version") if isinstance(found, dict) else found
        console.print(f"{name}:{alias} -> v{target}")


workers_app = typer.Typer(
    help="Trainer workers (plain `swarm workers` lists): cordon, uncordon, drain, clear, benchmark."
)
app.add_typer(workers_app, name="workers")


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


@workers_app.callback(invoke_without_command=True)
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the workers the scheduler knows."""
    if ctx.invoked_subcommand is not None:
        return
    listing(
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


ReasonOpt = Annotated[str, typer.Option(help="why, shown to other operators")]


def _ops_done(ops: WorkerOps, as_json: bool, what: str) -> None:
    if as_json:
        dump(ops)
    else:
        console.print(f"worker {ops.worker_id} {what}")


@workers_app.command("cordon")
def workers_cordon(worker_id: str, reason: ReasonOpt = "", as_json: JsonOpt = False) -> None:
    """No new jobs on WORKER_ID; its running jobs go on (until `uncordon`)."""
    _ops_done(run(lambda: client().cordon_worker(worker_id, reason)), as_json, "cordoned")


@workers_app.command("uncordon")
def workers_uncordon(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID takes jobs again (ends a cordon or a drain)."""
    _ops_done(run(lambda: client().uncordon_worker(worker_id)), as_json, "schedulable again")


@workers_app.command("clear")
def workers_clear(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID is no longer suspect (a replay of its work did not match); it takes jobs again
    unless cordoned or drained."""
    _ops_done(run(lambda: client().clear_worker(worker_id)), as_json, "cleared")


@workers_app.command("drain")
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
    _ops_done(ops, as_json, what)


@workers_app.command("benchmark")
def workers_benchmark(worker_id: str, as_json: JsonOpt = False) -> None:
    """WORKER_ID measures its speed again now (a matmul and LoRA training steps)."""
    result = run(lambda: client().benchmark_worker(worker_id))
    if as_json:
        dump(result)
        return
    console.print(
        f"worker {worker_id}: {speed(result)} ({result.dtype} on {result.device}, "
        f"measured in {result.duration_s:.1f} s)"
    )


# --- providers (admin, on the NATS host) --------------------------------------------------

providers_app = typer.Typer(
    help="Provider identities in the nats-server config: add (writes a join file), list, "
    "remove. Run where the config is; docs/providers.md."
)
app.add_typer(providers_app, name="providers")

ConfOpt = Annotated[
    Path,
    typer.Option(
        "--conf",
        envvar="SWARM_PROVIDERS_NATS_CONF",
        help="nats-server config with the providers section",
    ),
]
CredsDirOpt = Annotated[
    Path,
    typer.Option(
        "--creds-dir", envvar="SWARM_PROVIDERS_CREDS_DIR", help="where join files are written"
    ),
]
PidFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--pid-file",
        envvar="SWARM_PROVIDERS_NATS_PID_FILE",
        help="nats-server's pid file (its `pid_file` setting): it is sent SIGHUP to reload; "
        "without one the command prints what to run",
    ),
]
DEFAULT_CONF = Path("deploy/nats/nats-auth.conf")
DEFAULT_CREDS_DIR = Path(".swarm/providers")


def _providers(action: Callable[[], R]) -> R:
    from swarm.providers import ProviderError

    try:
        return action()
    except (ProviderError, ValueError, OSError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


@providers_app.command("add")
def providers_add(
    name: str,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            envvar="SWARM_PROVIDERS_NATS_URL",
            help="the URL providers reach NATS at, written into the join file",
        ),
    ] = None,
    conf: ConfOpt = DEFAULT_CONF,
    creds_dir: CredsDirOpt = DEFAULT_CREDS_DIR,
    pid_file: PidFileOpt = None,
) -> None:
    """A NATS user for provider NAME (which is also its worker id) and its join file."""
    from swarm.providers import add_provider, reload_nats
    from swarm_contracts.subjects import Subjects

    path, _ = _providers(lambda: add_provider(conf, creds_dir, name, nats_url, Subjects()))
    console.print(f"provider {name} added to {conf}; join file: {path} (mode 600)")
    console.print(_providers(lambda: reload_nats(pid_file)))
    console.print(
        f"send {path.name} to the provider over a private channel; they run "
        f"`swarm-trainer join --creds {path.name}`"
        + ("" if nats_url else " --nats nats://<this Swarm's NATS>:4222")
    )


@providers_app.command("list")
def providers_list(conf: ConfOpt = DEFAULT_CONF, as_json: JsonOpt = False) -> None:
    """The providers in the nats-server config."""
    from swarm.providers import list_providers

    found = _providers(lambda: list_providers(conf))
    if as_json:
        print(json.dumps([vars(p) for p in found], indent=2))
    else:
        table(
            "providers",
            ["name", "public key", "added"],
            [(p.name, p.public_key, p.added) for p in found],
        )


@providers_app.command("remove")
def providers_remove(
    name: str,
    conf: ConfOpt = DEFAULT_CONF,
    creds_dir: CredsDirOpt = DEFAULT_CREDS_DIR,
    pid_file: PidFileOpt = None,
) -> None:
    """Take provider NAME out of the config; once nats-server reloads, its connections are
    closed and its credentials refused."""
    from swarm.providers import reload_nats, remove_provider
    from swarm_contracts.subjects import Subjects

    deleted = _providers(lambda: remove_provider(conf, creds_dir, name, Subjects()))
    console.print(
        f"provider {name} removed from {conf}" + ("; join file deleted" if deleted else "")
    )
    console.print(_providers(lambda: reload_nats(pid_file)))


# --- chat ---------------------------------------------------------------------------------


def stream_answer(c: Client, model: str, messages: list[dict[str, Any]], **options: Any) -> str:
    """Print the answer as it streams in; return it whole."""
    parts: list[str] = []
    for chunk in c.chat_stream(model, messages, **options):
        if chunk.text:
            parts.append(chunk.text)
            # Plain stdout, unstyled: the model's text, exactly, for pipes as for terminals.
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(parts)


@app.command()
def chat(
    model: Annotated[
        str, typer.Argument(help="an adapter (bot, bot@3, bot@production) or a base model")
    ],
    prompt: Annotated[
        str | None,
        typer.Option("--prompt", "-p", help="send this one message, print the answer, exit"),
    ] = None,
    system: Annotated[str | None, typer.Option(help="a system message, sent first")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1)] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, max=2.0)] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", min=0.0, max=1.0)] = None,
    seed: Annotated[int | None, typer.Option(help="same seed, same sample")] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="stop string (repeatable)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Chat with an adapter or a base model; the answer streams as it is generated.

    Without --prompt: an interactive session that keeps the conversation (/reset forgets
    it, /exit or Ctrl-D ends it). With --prompt: one answer, then exit (--json: the whole
    answer as JSON, with usage)."""
    c = client()
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stop": stop or None,
    }
    if prompt is not None:
        if as_json:
            dump(run(lambda: c.chat(model, prompt, system=system, **options)))
        else:
            run(lambda: stream_answer(c, model, as_messages(prompt, system), **options))
        return
    if as_json:
        err.print("[red]error:[/] --json needs --prompt (an interactive chat is not JSON)")
        raise typer.Exit(2)
    history: list[dict[str, Any]] = []
    err.print(f"chatting with [bold]{model}[/] (/reset forgets the conversation, /exit ends it)")
    while True:
        try:
            line = console.input("[bold cyan]you>[/] ")
        except (EOFError, KeyboardInterrupt):
            err.print()
            return
        text = line.strip()
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            history.clear()
            continue
        if not text:
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = stream_answer(c, model, as_messages(history, system), **options)
        except SwarmError as exc:
            err.print(f"[red]error:[/] {exc}")
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})


# --- models -------------------------------------------------------------------------------


@models_app.callback(invoke_without_command=True)
def models_default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is None:
        models_ls(as_json=as_json)


@models_app.command("ls")
def models_ls(as_json: JsonOpt = False) -> None:
    """List base models."""
    listing(
        run(lambda: client().list_models()),
        as_json,
        "models",
        ["name", "version", "architecture", "parameters", "digest", "store key"],
        lambda m: (
            m.name,
            m.version,
            m.architecture,
            f"{m.parameter_count:,}",
            m.digest[:12],
            m.store_key,
        ),
    )


@models_app.command("add")
def models_add(
    name: str,
    path: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="model directory")],
    hf_id: Annotated[
        str | None,
        typer.Option(
            "--hf-id", help="the Hugging Face Hub id it came from (adapters will name it)"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a HF save_pretrained directory (safetensors only) as model NAME."""
    version = run(lambda: client().add_model(name, path, hf_id))
    if as_json:
        dump(version)
    else:
        console.print(f"registered [bold]{version.name}@{version.version}[/] ({version.store_key})")


@models_app.command("create-tiny")
def models_create_tiny(
    out: Path,
    random: Annotated[
        bool, typer.Option("--random", help="random weights: instant, knows nothing (tests)")
    ] = False,
    seed: Annotated[int, typer.Option(help="the same seed builds the same model")] = 0,
) -> None:
    """Write a tiny Llama model to OUT: pretrained by Swarm's trainer on a generated corpus
    (about a minute on 2 CPU cores the first time, cached after), or --random."""
    if not random:
        err.print("pretraining a tiny Llama on a generated corpus (cached after the first time)")
    cached = run(lambda: create_tiny_model(out, random=random, seed=seed))
    console.print(f"tiny model written to {out}" + (" (from the cache)" if cached else ""))


# --- datasets -----------------------------------------------------------------------------


@datasets_app.callback(invoke_without_command=True)
def datasets_default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is None:
        datasets_ls(as_json=as_json)


@datasets_app.command("ls")
def datasets_ls(as_json: JsonOpt = False) -> None:
    """List your datasets."""
    listing(
        run(lambda: client().list_datasets()),
        as_json,
        "datasets",
        ["id", "name", "format", "examples", "bytes", "created"],
        lambda d: (
            d.id,
            d.name,
            d.format,
            d.examples,
            f"{d.bytes:,}",
            d.created_at.strftime("%Y-%m-%d"),
        ),
    )


@datasets_app.command("stats")
def datasets_stats(
    dataset_id: str,
    model: Annotated[
        str | None, typer.Option(help="model name[@version] whose tokenizer counts tokens")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Examples and length percentiles (tokens with --model)."""
    stats = run(lambda: client().dataset_stats(dataset_id, model))
    if as_json:
        dump(stats)
        return
    rows = [("chars", stats["chars"])]
    if stats.get("tokens"):
        rows.append((f"tokens ({stats['token_method']})", stats["tokens"]))
    console.print(f"{stats['dataset']}: {stats['examples']} {stats['format']} examples")
    table(
        "lengths",
        ["unit", "mean", "p50", "p90", "p95", "p99", "max"],
        [(u, *(p[k] for k in ("mean", "p50", "p90", "p95", "p99", "max"))) for u, p in rows],
    )


@datasets_app.command("upload")
def datasets_upload(
    path: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, help="JSONL file, plain or gzip/zstd"),
    ],
    name: Annotated[str | None, typer.Option(help="a label; defaults to the file name")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL dataset (text, prompt/completion or chat), plain, .gz or .zst; it
    streams from disk, and a bad file gets its first 20 bad lines named."""
    info = run(lambda: client().upload_dataset(path, name=name))
    if as_json:
        dump(info)
    else:
        console.print(f"dataset [bold]{info.id}[/]: {info.examples} {info.format} examples")


if __name__ == "__main__":
    app()

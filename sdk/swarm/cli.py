"""The ``swarm`` command line: local stack, demo, jobs, datasets, models, adapters, workers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from swarm.client import Client, SwarmError
from swarm.progress import follow, report
from swarm.sse import JobStreamEvent

T = TypeVar("T", bound=BaseModel)

app = typer.Typer(help="Swarm: decentralized LoRA fine-tuning.", no_args_is_help=True)
jobs_app = typer.Typer(help="List, show, cancel and follow jobs (plain `swarm jobs` lists).")
models_app = typer.Typer(help="Base models in the registry (plain `swarm models` lists).")
datasets_app = typer.Typer(help="Uploaded datasets (plain `swarm datasets` lists).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(models_app, name="models")
app.add_typer(datasets_app, name="datasets")
adapters_app = typer.Typer(help="Registered adapters (plain `swarm adapters` lists).")
app.add_typer(adapters_app, name="adapters")

console = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON output")]


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
        dump(found)  # type: ignore[arg-type]
    else:
        table(title, columns, [row(item) for item in found])


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    t = Table(title=title)
    for i, c in enumerate(columns):
        # Ids are meant to be copied: never wrap the first column.
        t.add_column(c, no_wrap=i == 0)
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    console.print(t)


# --- local stack & demo -------------------------------------------------------------------


@app.command()
def up(
    root: Annotated[Path, typer.Option(help="state directory")] = Path(".swarm"),
) -> None:
    """Run nats-server and the five services locally until Ctrl-C."""
    from swarm.local_stack import LocalStack, StackError

    try:
        code = LocalStack(root, console=err).run_forever()
    except StackError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command()
def demo(
    steps: Annotated[int, typer.Option(help="training steps")] = 60,
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
        err.print(f"[red]{path} must hold a YAML mapping (a job spec)[/]")
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


def event_line(ev: JobStreamEvent) -> str:
    fields = {k: v for k, v in ev.payload.items() if k not in ("event", "job_id", "spec")}
    return f"{ev.id:>6} {ev.event:<10} " + " ".join(f"{k}={v}" for k, v in fields.items())


@jobs_app.command("events")
def jobs_events(
    job_id: str,
    after: Annotated[
        str | None, typer.Option("--after", help="only events after this event id")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's events (history, then live) until it ends; --json prints CloudEvents."""

    def stream() -> None:
        for ev in client().events(job_id, last_event_id=after):
            if as_json:
                # One JSON object per line (JSON Lines), so that a pipe sees each at once: the
                # CloudEvent plus "seq", the id to resume after (--after).
                print(json.dumps({**ev.data, "seq": ev.id}), flush=True)
            else:
                console.print(event_line(ev), highlight=False, markup=False)

    run(stream)


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a job in any state."""
    record = run(lambda: client().cancel(job_id))
    if as_json:
        dump(record)
    else:
        console.print(f"cancel requested for {record.job_id} (was {record.state})")


@jobs_app.command("follow")
def jobs_follow(job_id: str) -> None:
    """Show a job's progress until it ends."""
    c = client()
    raise typer.Exit(report(run(lambda: follow(c, job_id, console)), console))


# --- adapters, workers --------------------------------------------------------------------


def adapters_table(found: Sequence[Any]) -> None:
    table(
        "adapters",
        ["name", "version", "base model", "job", "eval loss", "created"],
        [
            (
                a.name,
                a.version,
                f"{a.lineage.base_model}@{a.lineage.base_model_version}",
                a.lineage.job_id,
                a.lineage.metrics.get("eval_loss"),
                a.created_at.strftime("%Y-%m-%d %H:%M:%S"),
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


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``name`` or ``name@version``."""
    name, _, version = ref.partition("@")
    if version and not version.isdigit():
        err.print(f"[red]error:[/] {ref!r} is not NAME or NAME@VERSION")
        raise typer.Exit(2)
    return name, int(version) if version else None


@adapters_app.command("show")
def adapters_show(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (latest if no version)")],
    as_json: JsonOpt = False,
) -> None:
    """Show an adapter version with its lineage."""
    name, version = parse_ref(ref)
    found = run(lambda: client().get_adapter(name, version))
    if as_json:
        dump(found)
        return
    console.print(yaml.safe_dump(found.model_dump(mode="json"), sort_keys=False))


@adapters_app.command("pull")
def adapters_pull(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (latest if no version)")],
    out: Annotated[Path | None, typer.Option(help="directory; default ./NAME-vVERSION")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download an adapter's PEFT files (adapter_config.json, adapter_model.safetensors)."""
    c = client()
    name, version = parse_ref(ref)
    if version is None:
        version = run(lambda: c.get_adapter(name)).version
    assert version is not None
    dest = out or Path(f"{name}-v{version}")
    files = run(lambda: c.download_adapter(name, version, dest))
    if as_json:
        dump({"name": name, "version": version, "files": [str(f) for f in files]})
    else:
        console.print(f"{name} v{version}: {len(files)} files in {dest}")


@adapters_app.command("export")
def adapters_export(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (latest if no version)")],
    as_json: JsonOpt = False,
) -> None:
    """Merge an adapter into its base model (a from_pretrained model in the store)."""
    c = client()
    name, version = parse_ref(ref)
    if version is None:
        version = run(lambda: c.get_adapter(name)).version
    assert version is not None
    with console.status(f"merging {name} v{version} into its base model…"):
        result = run(lambda: c.export_adapter(name, version))
    if as_json:
        dump(result)
    else:
        console.print(f"{result.adapter} merged into {result.base_model}: {result.store_key}")


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


@app.command()
def workers(as_json: JsonOpt = False) -> None:
    """List the workers the scheduler knows."""
    listing(
        run(lambda: client().workers()),
        as_json,
        "workers",
        ["id", "state", "cpus free/total", "gpus free/total", "running", "last heartbeat"],
        lambda w: (
            w.worker_id,
            w.state,
            f"{w.free.cpus}/{w.resources.cpus}",
            f"{len(w.free.gpus)}/{len(w.resources.gpus)}",
            ", ".join(r.job_id for r in w.running),
            w.last_heartbeat.strftime("%H:%M:%S"),
        ),
    )


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
    as_json: JsonOpt = False,
) -> None:
    """Upload a HF save_pretrained directory (safetensors only) as model NAME."""
    version = run(lambda: client().add_model(name, path))
    if as_json:
        dump(version)
    else:
        console.print(f"registered [bold]{version.name}@{version.version}[/] ({version.store_key})")


def create_tiny_model(out: Path) -> None:
    """The trainer package owns the tiny model; run it as a program so the CLI needs no torch."""
    proc = subprocess.run([sys.executable, "-m", "swarm_trainer.tiny_model", str(out)], check=False)
    if proc.returncode != 0:
        raise SwarmError(
            f"`{sys.executable} -m swarm_trainer.tiny_model {out}` failed (exit {proc.returncode});"
            " is swarm-trainer installed (pip install -e services/trainer)?"
        )


@models_app.command("create-tiny")
def models_create_tiny(out: Path) -> None:
    """Write a tiny randomly initialised Llama model to OUT (for demos and tests)."""
    run(lambda: create_tiny_model(out))
    console.print(f"tiny model written to {out}")


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
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL file")],
    name: Annotated[str | None, typer.Option(help="a label; defaults to the file name")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL dataset (text, prompt/completion or chat)."""
    info = run(lambda: client().upload_dataset(path, name=name))
    if as_json:
        dump(info)
    else:
        console.print(f"dataset [bold]{info.id}[/]: {info.examples} {info.format} examples")


if __name__ == "__main__":
    app()

"""``swarm datasets``: upload, list and measure datasets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from swarm.cli.output import JsonOpt, lists_by_default, out
from swarm.cli.session import client, run

group = typer.Typer(help="Uploaded datasets (plain `swarm datasets` lists).")

PERCENTILES = ("mean", "p50", "p90", "p95", "p99", "max")
# How often a background upload's progress is read.
POLL_S = 0.5


@group.command("ls")
@lists_by_default(group)
def datasets_ls(as_json: JsonOpt = False) -> None:
    """List your datasets."""
    out.listing(
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


@group.command("stats")
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
        out.json(stats)
        return
    rows = [("chars", stats["chars"])]
    if stats.get("tokens"):
        rows.append((f"tokens ({stats['token_method']})", stats["tokens"]))
    out.console.print(f"{stats['dataset']}: {stats['examples']} {stats['format']} examples")
    out.table(
        "lengths",
        ["unit", *PERCENTILES],
        [(unit, *(p[k] for k in PERCENTILES)) for unit, p in rows],
    )
    if stats.get("error"):
        out.console.print(f"[dim]{stats['error']}[/]")


@group.command("upload")
def datasets_upload(
    path: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, help="JSONL file, plain or gzip/zstd"),
    ],
    name: Annotated[str | None, typer.Option(help="a label; defaults to the file name")] = None,
    background: Annotated[
        bool,
        typer.Option(
            "--background",
            help="return once the file is sent, the gateway checking it meanwhile; shows the "
            "check's progress until done (Ctrl-C stops watching, not the check)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL dataset (text, prompt/completion or chat), plain, .gz or .zst; it
    streams from disk, and a bad file gets its first 20 bad lines named."""
    if background:
        started = run(lambda: client().start_dataset_upload(path, name=name))
        if as_json:
            out.json(started)
            return
        _watch(started.upload_id)
        return
    info = run(lambda: client().upload_dataset(path, name=name))
    out.result(info, as_json, f"dataset [bold]{info.id}[/]: {info.examples} {info.format} examples")


@group.command("upload-status")
def datasets_upload_status(upload_id: str, as_json: JsonOpt = False) -> None:
    """A background upload: its check's progress, then its dataset or bad lines."""
    if as_json:
        out.json(run(lambda: client().dataset_upload(upload_id)))
        return
    _watch(upload_id)


def _watch(upload_id: str) -> None:
    """The check's progress as a bar until it ends; exit 1 for a file that is no dataset."""
    out.console.print(f"upload [bold]{upload_id}[/] (swarm datasets upload-status {upload_id})")
    with Progress(
        TextColumn("checking"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[lines]}"),
        console=out.console,
    ) as bar:
        task = bar.add_task("check", total=None, lines="")
        while True:
            upload = run(lambda: client().dataset_upload(upload_id))
            lines = f"{upload.lines_checked:,} lines"
            bar.update(task, total=upload.bytes_total, completed=upload.bytes_checked, lines=lines)
            if upload.state != "validating":
                break
            time.sleep(POLL_S)
    if upload.state == "invalid":
        out.console.print(f"[red]not a dataset[/]: {upload.error}")
        raise typer.Exit(1)
    info = upload.dataset
    assert info is not None
    out.console.print(f"dataset [bold]{info.id}[/]: {info.examples} {info.format} examples")

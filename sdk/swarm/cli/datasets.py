"""``swarm datasets``: upload, list and measure datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from swarm.cli.output import JsonOpt, lists_by_default, out
from swarm.cli.session import client, run

group = typer.Typer(help="Uploaded datasets (plain `swarm datasets` lists).")

PERCENTILES = ("mean", "p50", "p90", "p95", "p99", "max")


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
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL dataset (text, prompt/completion or chat), plain, .gz or .zst; it
    streams from disk, and a bad file gets its first 20 bad lines named."""
    info = run(lambda: client().upload_dataset(path, name=name))
    out.result(info, as_json, f"dataset [bold]{info.id}[/]: {info.examples} {info.format} examples")

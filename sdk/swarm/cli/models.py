"""``swarm models``: list and upload base models, and build the tiny test model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from swarm.cli.output import JsonOpt, lists_by_default, out
from swarm.cli.session import client, run
from swarm.tiny_model import create_tiny_model

group = typer.Typer(help="Base models in the registry (plain `swarm models` lists).")


@group.command("ls")
@lists_by_default(group)
def models_ls(as_json: JsonOpt = False) -> None:
    """List base models."""
    out.listing(
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


@group.command("add")
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
    out.result(
        version,
        as_json,
        f"registered [bold]{version.name}@{version.version}[/] ({version.store_key})",
    )


@group.command("create-tiny")
def models_create_tiny(
    out_dir: Annotated[Path, typer.Argument(metavar="out")],
    random: Annotated[
        bool, typer.Option("--random", help="random weights: instant, knows nothing (tests)")
    ] = False,
    seed: Annotated[int, typer.Option(help="the same seed builds the same model")] = 0,
) -> None:
    """Write a tiny Llama model to OUT: pretrained by Swarm's trainer on a generated corpus
    (about a minute on 2 CPU cores the first time, cached after), or --random."""
    if not random:
        out.err.print(
            "pretraining a tiny Llama on a generated corpus (cached after the first time)"
        )
    cached = run(lambda: create_tiny_model(out_dir, random=random, seed=seed))
    out.console.print(f"tiny model written to {out_dir}" + (" (from the cache)" if cached else ""))

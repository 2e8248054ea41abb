"""``swarm adapters``: list, show, pull, export (merge), alias and release registered
adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from swarm.cli.output import JsonOpt, lists_by_default, out
from swarm.cli.session import client, run

group = typer.Typer(help="Registered adapters (plain `swarm adapters` lists).")

RefArg = Annotated[str, typer.Argument(help="NAME (the latest), NAME@VERSION or NAME@ALIAS")]


@group.command("ls")
@lists_by_default(group)
def adapters_ls(
    name: Annotated[str | None, typer.Option(help="only this adapter")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List your registered adapters."""
    out.listing(
        run(lambda: client().list_adapters(name)),
        as_json,
        "adapters",
        ["name", "version", "base model", "job", "eval loss", "created", "quarantined"],
        lambda a: (
            a.name,
            a.version,
            f"{a.lineage.base_model}@{a.lineage.base_model_version}",
            a.lineage.job_id,
            a.lineage.metrics.get("eval_loss"),
            a.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            a.quarantine.reason[:60] if a.quarantine else "",
        ),
    )


@group.command("show")
def adapters_show(ref: RefArg, as_json: JsonOpt = False) -> None:
    """Show an adapter version with its lineage."""
    found = run(lambda: client().resolve_adapter(ref))
    if as_json:
        out.json(found)
        return
    out.console.print(yaml.safe_dump(found.model_dump(mode="json"), sort_keys=False))


@group.command("pull")
def adapters_pull(
    ref: RefArg,
    out_: Annotated[
        Path | None, typer.Option("--out", help="directory; default ./NAME-vVERSION")
    ] = None,
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
    dest = out_ or Path(f"{name}-v{version}")
    pull = c.pull_adapter_with_base if with_base else c.download_adapter
    files = run(lambda: pull(name, version, dest))
    out.result(
        {"name": name, "version": version, "files": [str(f) for f in files]},
        as_json,
        f"{name} v{version}: {len(files)} files in {dest}",
    )


@group.command("export")
def adapters_export(
    ref: RefArg,
    download: Annotated[
        Path | None, typer.Option(help="then fetch the merged model into this directory")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Merge an adapter into its base model (a from_pretrained model in the store)."""
    c = client()
    found = run(lambda: c.resolve_adapter(ref))
    name, version = found.name, found.version
    with out.console.status(f"merging {name} v{version} into its base model…"):
        result = run(lambda: c.export_adapter(name, version))
    if download is not None:
        with out.console.status(f"downloading the merged model to {download}…"):
            run(lambda: c.download_export(name, version, download))
    if as_json:
        out.json(result)
        return
    out.console.print(f"{result.adapter} merged into {result.base_model}: {result.store_key}")
    if download is not None:
        out.console.print(f"merged model in {download} (from_pretrained loads it)")


@group.command("unquarantine")
def adapters_unquarantine(
    name: str,
    version: int,
    tenant: Annotated[str | None, typer.Option(help="the version's tenant")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Admins: release a version its job's failed verification quarantined."""
    found = run(lambda: client().unquarantine_adapter(name, version, tenant))
    out.result(found, as_json, f"{name}@{version} ({found.tenant}) is out of quarantine")


@group.command("alias")
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
    out.result(found, as_json, f"{name}:{alias} -> v{found.get('version')}")

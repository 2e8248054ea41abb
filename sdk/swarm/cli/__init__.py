"""The ``swarm`` command line: local stack, demo, jobs, sweeps, datasets, models, adapters,
workers, providers, chat.

One module per command group; this one joins them and reads the global options. What the
commands print goes through ``swarm.cli.output``."""

from __future__ import annotations

from typing import Annotated

import typer

from swarm.cli import adapters, chat, datasets, jobs, models, providers, stack, sweeps, workers
from swarm.cli.session import state

app = typer.Typer(help="Swarm: decentralized LoRA fine-tuning.", no_args_is_help=True)


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


# `swarm --help` lists the commands in this order, then the groups in theirs.
app.command()(stack.up)
app.command()(stack.demo)
app.command()(jobs.submit)
app.command()(chat.chat)
app.add_typer(jobs.group, name="jobs")
app.add_typer(models.group, name="models")
app.add_typer(datasets.group, name="datasets")
app.add_typer(adapters.group, name="adapters")
app.add_typer(sweeps.run_group, name="sweep")
app.add_typer(sweeps.group, name="sweeps")
app.add_typer(workers.group, name="workers")
app.add_typer(providers.group, name="providers")

"""``swarm providers`` (an admin's commands, on the NATS host): provider identities in the
nats-server config, and the join files that carry them to providers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from swarm.cli.output import JsonOpt, out
from swarm.providers import (
    ProviderError,
    add_provider,
    list_providers,
    reload_nats,
    remove_provider,
)
from swarm_contracts.subjects import Subjects

R = TypeVar("R")

group = typer.Typer(
    help="Provider identities in the nats-server config: add (writes a join file), list, "
    "remove. Run where the config is; docs/providers.md."
)

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


def checked(action: Callable[[], R]) -> R:
    """A bad config file, name or key is one line and exit code 2, not a traceback."""
    try:
        return action()
    except (ProviderError, ValueError, OSError) as exc:
        out.error(exc)


@group.command("add")
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
    path, _ = checked(lambda: add_provider(conf, creds_dir, name, nats_url, Subjects()))
    out.console.print(f"provider {name} added to {conf}; join file: {path} (mode 600)")
    out.console.print(checked(lambda: reload_nats(pid_file)))
    out.console.print(
        f"send {path.name} to the provider over a private channel; they run "
        f"`swarm-trainer join --creds {path.name}`"
        + ("" if nats_url else " --nats nats://<this Swarm's NATS>:4222")
    )


@group.command("list")
def providers_list(conf: ConfOpt = DEFAULT_CONF, as_json: JsonOpt = False) -> None:
    """The providers in the nats-server config."""
    found = checked(lambda: list_providers(conf))
    out.listing(
        [vars(p) for p in found],
        as_json,
        "providers",
        ["name", "public key", "added"],
        lambda p: (p["name"], p["public_key"], p["added"]),
    )


@group.command("remove")
def providers_remove(
    name: str,
    conf: ConfOpt = DEFAULT_CONF,
    creds_dir: CredsDirOpt = DEFAULT_CREDS_DIR,
    pid_file: PidFileOpt = None,
) -> None:
    """Take provider NAME out of the config; once nats-server reloads, its connections are
    closed and its credentials refused."""
    deleted = checked(lambda: remove_provider(conf, creds_dir, name, Subjects()))
    out.console.print(
        f"provider {name} removed from {conf}" + ("; join file deleted" if deleted else "")
    )
    out.console.print(checked(lambda: reload_nats(pid_file)))

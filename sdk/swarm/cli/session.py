"""What every command that talks to the gateway shares: the client made from the global
options, SDK errors turned into one line, and spec files read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from swarm.cli.output import out
from swarm.client import Client, SwarmError

R = TypeVar("R")


class State:
    """The global options (``swarm --url … --api-key …``), set before any command runs."""

    url: str | None = None
    api_key: str | None = None


state = State()


def client() -> Client:
    try:
        return Client(base_url=state.url, api_key=state.api_key)
    except ValueError as exc:  # an unreadable config file
        out.error(exc)


def run(action: Callable[[], R]) -> R:
    """Turn SDK errors into a one-line message and exit code 2, not a traceback."""
    try:
        return action()
    except (SwarmError, TimeoutError) as exc:
        out.error(exc)


def load_spec(path: Path) -> dict[str, Any]:
    """A job or sweep spec from a YAML (or JSON) file."""
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        out.fail(f"[red]cannot read {path}:[/] {exc}")
    if not isinstance(spec, dict):
        out.fail(f"[red]{path} must hold a YAML (or JSON) mapping: a job or sweep spec[/]")
    return spec

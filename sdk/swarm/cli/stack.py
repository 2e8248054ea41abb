"""``swarm up`` and ``swarm demo``: Swarm on this machine, and a first adapter trained on it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from swarm.cli.output import out
from swarm.cli.session import state


def up(
    root: Annotated[Path, typer.Option(help="state directory")] = Path(".swarm"),
) -> None:
    """Run nats-server and Swarm's services (inference and sweeps included) locally until Ctrl-C."""
    # Imported here: the local stack is only this command's, and the rest of the CLI starts
    # faster without it.
    from swarm.local_stack import LocalStack, StackError

    try:
        # A NATS already on the address is used only when named on purpose.
        reuse = "SWARM_NATS_URL" in os.environ
        code = LocalStack(root, console=out.err, reuse_nats=reuse).run_forever()
    except StackError as exc:
        out.fail(f"[red]{exc}[/]", code=1)
    raise typer.Exit(code)


def demo(
    steps: Annotated[int, typer.Option(help="training steps")] = 400,
    root: Annotated[Path, typer.Option(help="state directory for a temporary stack")] = Path(
        ".swarm/demo"
    ),
) -> None:
    """Train a LoRA adapter on a tiny model end to end, starting a local stack if needed."""
    from swarm.demo import run_demo

    code = run_demo(state.url, state.api_key, steps=steps, root=root, console=out.console)
    raise typer.Exit(code)

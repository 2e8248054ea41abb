"""``python -m swarm``: the ``swarm`` command."""

from swarm.cli import app

app(prog_name="swarm")

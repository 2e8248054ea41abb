"""A tiny randomly initialised Llama model for demos and tests (``swarm models create-tiny``,
``swarm demo``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swarm.client import SwarmError


def create_tiny_model(out: Path) -> None:
    """The trainer package owns the tiny model; run it as a program so the SDK needs no torch."""
    proc = subprocess.run([sys.executable, "-m", "swarm_trainer.tiny_model", str(out)], check=False)
    if proc.returncode != 0:
        raise SwarmError(
            f"`{sys.executable} -m swarm_trainer.tiny_model {out}` failed (exit {proc.returncode});"
            " is swarm-trainer installed (pip install -e services/trainer)?"
        )

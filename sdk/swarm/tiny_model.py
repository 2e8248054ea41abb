"""A tiny Llama model for demos and tests (``swarm models create-tiny``, ``swarm demo``):
pretrained by Swarm's trainer on a generated corpus (about a minute on two CPU cores), or with
``random`` its random-weight variant (instant, for tests that need speed).

Built once per kind, seed and recipe, then copied from the cache: a second call is instant.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swarm.client import SwarmError

# Bump when the trainer's tiny-model recipe changes, so a stale cached build is not reused.
RECIPE = "v2"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swarm" / "tiny-models"


def create_tiny_model(out: Path, *, random: bool = False, seed: int = 0) -> bool:
    """Write the model to ``out``; True when it came from the cache. The trainer package owns
    the model; it runs as a program so the SDK needs no torch."""
    cached = cache_root() / f"{'random' if random else 'pretrained'}-{RECIPE}-seed{seed}"
    hit = (cached / "config.json").exists()
    if not hit:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
            building = Path(tmp) / "model"
            args = [sys.executable, "-m", "swarm_trainer.tiny_model", str(building)]
            args += ["--seed", str(seed)] + (["--random"] if random else [])
            proc = subprocess.run(args, check=False)
            if proc.returncode != 0:
                raise SwarmError(
                    f"`{' '.join(args)}` failed (exit {proc.returncode});"
                    " is swarm-trainer installed (pip install -e services/trainer)?"
                )
            # Renamed into place whole: a build cut short never looks like a cached one (and
            # of two concurrent builds, the first renamed wins).
            if not cached.exists():
                building.rename(cached)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cached, out, dirs_exist_ok=True)
    return hit

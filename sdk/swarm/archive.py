"""Unpacking a downloaded adapter (or model) tar without trusting its member names, and
making a pulled adapter directory loadable with its base model beside it."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

# Where ``swarm adapters pull NAME --with-base`` puts the base model, inside the adapter's dir.
BASE_DIR = "base"


def extract_adapter(tar_path: Path, dest: Path) -> list[Path]:
    """Extract regular files only; the ``data`` filter refuses absolute paths, ``..`` and links."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(dest, members=members, filter="data")
    return sorted(dest / m.name for m in members)


def point_at_base(adapter_dir: Path, base_dir: Path) -> None:
    """Make ``adapter_config.json`` name ``base_dir`` as its base model, relative to the
    adapter's directory (``./base``), so that the directory can be moved or copied whole.

    The registered adapter names its base model by Hugging Face id or registry
    ``name@version`` (``swarm_contracts.jobs.base_model_reference``); a local copy is only
    found by its path. PEFT resolves a relative path against the working directory, so
    ``AutoPeftModelForCausalLM.from_pretrained(".")`` loads it from inside the directory, and
    ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(DIR / "base"), DIR)``
    from anywhere (README). This file then no longer matches the registered sha256; every
    other key is kept, so peft and vLLM read it as before."""
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    relative = os.path.relpath(base_dir.resolve(), adapter_dir.resolve())
    config["base_model_name_or_path"] = f"./{Path(relative).as_posix()}"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

"""Unpacking a downloaded adapter tar without trusting its member names."""

from __future__ import annotations

import tarfile
from pathlib import Path


def extract_adapter(tar_path: Path, dest: Path) -> list[Path]:
    """Extract regular files only; the ``data`` filter refuses absolute paths, ``..`` and links."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(dest, members=members, filter="data")
    return sorted(dest / m.name for m in members)

"""Every random number generator a training step touches, captured and restored exactly.

Python's ``random``, NumPy's global generator, torch's CPU generator and (when present) each
CUDA device's generator. Tensors go to safetensors and the rest to JSON, so a checkpoint from
the store is never unpickled.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_files(rank: int) -> tuple[str, str]:
    # Per rank: each rank draws its own dropout masks, so each resumes its own stream.
    return f"rng_rank{rank}.safetensors", f"rng_rank{rank}.json"


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            tensors[f"torch_cuda_{i}"] = torch.cuda.get_rng_state(i)
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys).astype(np.int64))
    version, internal, gauss_next = random.getstate()
    meta = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": kind, "pos": pos, "has_gauss": has_gauss, "cached": cached},
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            if f"torch_cuda_{i}" in tensors:
                torch.cuda.set_rng_state(tensors[f"torch_cuda_{i}"], i)
    n = meta["numpy"]
    keys = tensors["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached"]))
    p = meta["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def save_rng(directory: Path, rank: int) -> None:
    tensor_file, json_file = rng_files(rank)
    tensors, meta = capture_rng()
    save_file(tensors, directory / tensor_file)
    (directory / json_file).write_text(json.dumps(meta))


def load_rng(directory: Path, rank: int) -> bool:
    """Restore this rank's generators; False when the checkpoint has none for this rank
    (a run resumed with more workers than it was saved with)."""
    tensor_file, json_file = rng_files(rank)
    if not (directory / tensor_file).exists():
        return False
    restore_rng(load_file(directory / tensor_file), json.loads((directory / json_file).read_text()))
    return True

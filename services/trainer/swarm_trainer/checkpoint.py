"""What a checkpoint holds, written and read back without pickle.

Rank 0 writes the adapter, the optimizer (safetensors + JSON), the LR schedule (JSON), the
loop state (step, data position, eval history, best step) and the best adapter so far;
every rank writes its own RNG state. Ray Train copies every rank's files into one
checkpoint directory and records it as committed only once all ranks have reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from swarm_common.store import NotFound, ObjectStore, join_key

ADAPTER_FILE = "adapter_model.safetensors"
BEST_ADAPTER_FILE = "best_adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"
SCHEDULER_FILE = "scheduler.json"
STATE_FILE = "trainer_state.json"
# Ray Train v2 rewrites this file in the run directory each time it registers a checkpoint
# (and before deleting old ones); a checkpoint directory it does not list was never
# committed, e.g. a worker died while uploading it, and ``get_checkpoint`` never returns it.
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


def checkpoint_dir_name(step: int) -> str:
    return f"checkpoint_{step:08d}"


def save_adapter(model: PeftModel, directory: Path) -> None:
    """PEFT layout: ``adapter_config.json`` + ``adapter_model.safetensors``, nothing else."""
    model.save_pretrained(directory, safe_serialization=True)
    # PEFT's model card names a temp dir of this worker: meaningless anywhere else.
    (directory / "README.md").unlink(missing_ok=True)


def save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Optimizer state as safetensors (tensors) + JSON (hyperparameters): no pickle anywhere."""
    sd = optimizer.state_dict()
    tensors = {
        f"{param_id}.{name}": value.detach().contiguous()
        for param_id, param_state in sd["state"].items()
        for name, value in param_state.items()
    }
    save_file(tensors, directory / OPTIMIZER_FILE)
    (directory / OPTIMIZER_GROUPS_FILE).write_text(json.dumps(sd["param_groups"]))


def load_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(directory / OPTIMIZER_FILE).items():
        param_id, name = key.split(".", 1)
        state.setdefault(int(param_id), {})[name] = value
    groups = json.loads((directory / OPTIMIZER_GROUPS_FILE).read_text())
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(
    directory: Path,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    best_adapter: dict[str, torch.Tensor] | None = None,
) -> None:
    """Rank 0's share of a checkpoint (call ``save_rng`` on every rank as well)."""
    save_adapter(model, directory)
    save_optimizer(optimizer, directory)
    # LambdaLR's state is counters and rates (its lambdas are not saved): plain JSON.
    (directory / SCHEDULER_FILE).write_text(json.dumps(scheduler.state_dict()))
    (directory / STATE_FILE).write_text(json.dumps(state))
    if best_adapter is not None:
        save_file(best_adapter, directory / BEST_ADAPTER_FILE)


def load_checkpoint(
    directory: Path,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    # Safetensors and JSON only: a checkpoint from the store is never unpickled.
    set_peft_model_state_dict(model, load_file(directory / ADAPTER_FILE))
    load_optimizer(optimizer, directory)
    scheduler.load_state_dict(json.loads((directory / SCHEDULER_FILE).read_text()))
    return json.loads((directory / STATE_FILE).read_text())


def load_best_adapter(directory: Path) -> dict[str, torch.Tensor] | None:
    path = directory / BEST_ADAPTER_FILE
    return load_file(path) if path.exists() else None


def committed_checkpoint_step(store: ObjectStore, job_id: str) -> int:
    """The step a new attempt of ``job_id`` resumes from: Ray's latest committed checkpoint
    (run directory ``checkpoints/<job_id>``), never a directory that merely exists."""
    try:
        snapshot = json.loads(store.get_bytes(join_key("checkpoints", job_id, SNAPSHOT_FILE)))
    except NotFound:
        return 0
    latest = snapshot.get("latest_checkpoint_result") or {}
    name = latest.get("checkpoint_dir_name") or ""
    return int(name.rsplit("_", 1)[-1]) if name.startswith("checkpoint_") else 0

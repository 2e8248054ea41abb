"""What a checkpoint holds, written and read back without pickle.

Rank 0 writes the adapter, the optimizer (safetensors + JSON), the LR schedule (JSON) and the
loop's ``TrainState`` (step, data position, evaluations as JSON; the best adapter so far);
every rank writes its own RNG state. Ray Train copies every rank's files into one
checkpoint directory and records it as committed only once all ranks have reported; which
checkpoints a run committed, and where a new attempt starts, is ``resume_point``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file

# checkpoint_dir_name is re-exported: the loop and the hooks name directories by it.
from swarm_contracts.layout import checkpoint_dir_name as checkpoint_dir_name
from swarm_trainer.sharding import REPLICATED, Sharding
from swarm_trainer.train_state import TrainState

ADAPTER_FILE = "adapter_model.safetensors"
BEST_ADAPTER_FILE = "best_adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"
SCHEDULER_FILE = "scheduler.json"
STATE_FILE = "trainer_state.json"


def save_adapter(
    model: PeftModel,
    directory: Path,
    base_reference: str | None = None,
    lora_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """PEFT layout: ``adapter_config.json`` + ``adapter_model.safetensors``, nothing else.

    ``lora_state``: the full LoRA weights under the model's parameter names, when the model's
    own are shards (``Sharding.lora_state``); PEFT saves them as it would its own.

    ``base_reference`` replaces ``base_model_name_or_path``, which PEFT fills with the local
    directory the base model was loaded from (a temp dir of this worker, meaningless anywhere
    else): the adapter names a base model a reader can resolve
    (``swarm_contracts.jobs.base_model_reference``)."""
    extra = {} if lora_state is None else {"state_dict": lora_state}
    model.save_pretrained(directory, safe_serialization=True, **extra)
    # PEFT's model card names the same temp dir.
    (directory / "README.md").unlink(missing_ok=True)
    if base_reference is not None:
        config_path = directory / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_reference
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_optimizer(sd: dict[str, Any], directory: Path) -> None:
    """Optimizer state (``optimizer.state_dict()`` or the gathered one of a sharded model,
    keyed by parameter name) as safetensors (tensors) + JSON (hyperparameters): no pickle
    anywhere."""
    tensors = {
        f"{param_id}.{name}": value.detach().contiguous()
        for param_id, param_state in sd["state"].items()
        for name, value in param_state.items()
    }
    save_file(tensors, directory / OPTIMIZER_FILE)
    (directory / OPTIMIZER_GROUPS_FILE).write_text(json.dumps(sd["param_groups"]))


def load_optimizer(directory: Path) -> dict[str, Any]:
    state: dict[int | str, dict[str, torch.Tensor]] = {}
    for key, value in load_file(directory / OPTIMIZER_FILE).items():
        # A parameter's index, or its dotted name; the state's own names have no dot.
        param, name = key.rsplit(".", 1)
        state.setdefault(int(param) if param.isdigit() else param, {})[name] = value
    groups = json.loads((directory / OPTIMIZER_GROUPS_FILE).read_text())
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    directory: Path,
    model: PeftModel,
    optimizer_state: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainState,
    lora_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """Rank 0's share of a checkpoint (call ``save_rng`` on every rank as well). The
    optimizer's state and ``lora_state`` as ``Sharding`` gathered them (on every rank)."""
    save_adapter(model, directory, lora_state=lora_state)
    save_optimizer(optimizer_state, directory)
    # LambdaLR's state is counters and rates (its lambdas are not saved): plain JSON.
    (directory / SCHEDULER_FILE).write_text(json.dumps(scheduler.state_dict()))
    (directory / STATE_FILE).write_text(json.dumps(state.to_json()))
    if state.best_weights is not None:
        save_file(state.best_weights, directory / BEST_ADAPTER_FILE)


def load_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sharding: Sharding = REPLICATED,
) -> TrainState:
    """Restore model, optimizer and schedule in place (on every rank: with ``fsdp`` each takes
    its shards); the loop's state is returned. ``model`` is what the step runs."""
    # Safetensors and JSON only: a checkpoint from the store is never unpickled.
    sharding.set_adapter_weights(sharding.unwrap(model), load_file(directory / ADAPTER_FILE))
    sharding.load_optimizer_state(model, optimizer, load_optimizer(directory))
    scheduler.load_state_dict(json.loads((directory / SCHEDULER_FILE).read_text()))
    best = directory / BEST_ADAPTER_FILE
    return TrainState.from_json(
        json.loads((directory / STATE_FILE).read_text()),
        best_weights=load_file(best) if best.exists() else None,
    )

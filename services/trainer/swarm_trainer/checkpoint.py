"""What a checkpoint holds, written and read back without pickle.

Rank 0 writes the adapter, the optimizer (safetensors + JSON), the LR schedule (JSON) and the
loop's ``TrainState`` (step, data position, evaluations as JSON; the best adapter so far);
every rank writes its own RNG state. Ray Train copies every rank's files into one
checkpoint directory and records it as committed only once all ranks have reported.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file

# checkpoint_dir_name is re-exported: the loop and the hooks name directories by it.
from swarm_contracts.layout import checkpoint_dir_name as checkpoint_dir_name
from swarm_contracts.layout import (
    checkpoint_prefix,
    join_key,
    resume_key,
    run_key,
)
from swarm_contracts.verification import VerifyTarget
from swarm_runtime.store import NotFound, ObjectStore
from swarm_trainer.sharding import REPLICATED, Sharding
from swarm_trainer.train_state import TrainState

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
SNAPSHOT_READ_TRIES = 10
# Written last into a resume copy: the copy is complete and was committed when copied.
RESUME_MARKER = "swarm_resume.json"
RESUME_TRIES = 5


class CheckpointError(RuntimeError):
    pass


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


@dataclass(frozen=True)
class ResumePoint:
    step: int
    key: str  # the store prefix of a complete checkpoint directory


def _snapshot(store: ObjectStore, job_id: str, attempt: int) -> dict[str, Any]:
    key = join_key(run_key(job_id, attempt), SNAPSHOT_FILE)
    for _ in range(SNAPSHOT_READ_TRIES):
        try:
            return json.loads(store.get_bytes(key))
        except NotFound:
            return {}
        except ValueError:
            # Ray rewrites the file in place (truncate, write): caught mid-write, read again.
            time.sleep(0.2)
    raise CheckpointError(f"{key}: unreadable")


def _latest(snapshot: dict[str, Any]) -> str | None:
    name = (snapshot.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name") or ""
    return name if name.startswith("checkpoint_") else None


def _listed(snapshot: dict[str, Any], dir_name: str) -> bool:
    results = snapshot.get("checkpoint_results") or []
    return dir_name == _latest(snapshot) or any(
        r.get("checkpoint_dir_name") == dir_name for r in results
    )


def _step(dir_name: str) -> int:
    return int(dir_name.rsplit("_", 1)[-1])


def committed_checkpoint_step(store: ObjectStore, job_id: str, attempt: int) -> int:
    """The step of the latest checkpoint ``attempt``'s run committed (0: none), from Ray's
    snapshot: a directory that merely exists may be a half-written upload."""
    name = _latest(_snapshot(store, job_id, attempt))
    return _step(name) if name else 0


def wait_committed(
    store: ObjectStore,
    job_id: str,
    attempt: int,
    step: int,
    timeout_s: float = 60.0,
    give_up: Callable[[], bool] = lambda: False,
) -> bool:
    """Until ``attempt``'s run has committed a checkpoint at ``step`` or later. Ray registers a
    reported checkpoint asynchronously (its controller polls the workers), so ``report``
    returning does not mean a new attempt could resume from it yet. ``give_up``: asked between
    polls; True ends the wait at once (the attempt is over, nobody needs the answer)."""
    deadline = time.monotonic() + timeout_s
    while committed_checkpoint_step(store, job_id, attempt) < step:
        if time.monotonic() > deadline or give_up():
            return False
        time.sleep(0.1)
    return True


def replay_start(store: ObjectStore, target: VerifyTarget) -> ResumePoint:
    """Where a replay starts: the target's checkpoint at ``from_step``, used in place (the
    target has ended, and the registry keeps a job's checkpoints while it is verified). Both
    ends must be committed checkpoints of the target's run, not merely directories."""
    snapshot = _snapshot(store, target.job_id, target.attempt)
    for step in (target.from_step, target.to_step):
        if not _listed(snapshot, checkpoint_dir_name(step)):
            raise CheckpointError(
                f"{target.job_id} attempt {target.attempt} has no committed checkpoint at "
                f"step {step} to replay"
            )
    return ResumePoint(
        step=target.from_step,
        key=checkpoint_prefix(target.job_id, target.attempt, target.from_step),
    )


def prepare_resume(
    store: ObjectStore, job_id: str, attempt: int, after: int = 0
) -> ResumePoint | None:
    """Where ``attempt`` starts: the latest checkpoint any earlier attempt (after attempt
    ``after``: a rerun does not trust those before) committed, copied to
    ``resume_key`` first (idempotent). The copy counts only if the source is still listed after
    it is complete: Ray drops a checkpoint from its snapshot before deleting its files, so an
    earlier attempt still running (frozen, then woken up) cannot prune it under us."""
    target = resume_key(job_id, attempt)
    try:
        marker = json.loads(store.get_bytes(join_key(target, RESUME_MARKER)))
        return ResumePoint(step=int(marker["step"]), key=target)
    except NotFound:
        pass
    for _ in range(RESUME_TRIES):
        candidates = []
        for earlier in range(after + 1, attempt):
            name = _latest(_snapshot(store, job_id, earlier))
            if name is not None:
                candidates.append((_step(name), earlier, name))
        if not candidates:
            return None
        # The furthest step; of equal ones the newest attempt, the least likely to be stale.
        step, source_attempt, name = max(candidates)
        source = join_key(run_key(job_id, source_attempt), name)
        store.delete_prefix(target + "/")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                store.download_dir(source, Path(tmp))
            except NotFound:
                continue  # pruned while we looked: pick again
            store.upload_dir(Path(tmp), target)
        if _listed(_snapshot(store, job_id, source_attempt), name):
            marker = {"step": step, "source": source}
            store.put_bytes(join_key(target, RESUME_MARKER), json.dumps(marker).encode())
            return ResumePoint(step=step, key=target)
    raise CheckpointError(f"{job_id}: checkpoints keep vanishing while copied for a resume")

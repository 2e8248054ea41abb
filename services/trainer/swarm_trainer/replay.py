"""A replay's end inside the loop: compare the adapter it reached with the target's checkpoint.

A replay job (``Assignment.verify``) resumes from the target's committed checkpoint at
``from_step`` with the target's spec, so its data order, RNG streams and LR schedule are the
target's; it trains to ``to_step`` saving nothing, and rank 0 writes a ``ReplayReport`` to the
run's output prefix, which the agent reads and reports in its ``replayed`` event.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load as load_safetensors

from swarm_contracts.layout import checkpoint_prefix, join_key, output_replay
from swarm_contracts.verification import ReplayReport
from swarm_trainer import reports
from swarm_trainer.checkpoint import ADAPTER_FILE
from swarm_trainer.train_state import TrainState

if TYPE_CHECKING:
    from swarm_trainer.recipe import Recipe


def relative_l2(
    ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]
) -> tuple[dict[str, float], list[str]]:
    """(``‖ours - theirs‖ / ‖theirs‖`` per matrix, in fp32 whatever they were trained in; the
    matrices on one side only or of different shapes, which cannot match). Against a zero
    matrix the distance is absolute: ``‖ours‖``."""
    distances: dict[str, float] = {}
    missing: list[str] = []
    for name in sorted(ours.keys() | theirs.keys()):
        if name not in ours or name not in theirs or ours[name].shape != theirs[name].shape:
            missing.append(name)
            continue
        a, b = ours[name].detach().float().cpu(), theirs[name].detach().float().cpu()
        diff, norm = torch.linalg.vector_norm(a - b).item(), torch.linalg.vector_norm(b).item()
        distances[name] = diff / norm if norm > 0 else diff
    return distances, missing


def finish_replay(recipe: Recipe, state: TrainState) -> None:
    """Every rank gathers the adapter (fsdp: a collective); rank 0 compares and reports."""
    started = time.monotonic()
    ours = recipe.sharding.adapter_weights(recipe.peft_model)
    if recipe.rank != 0:
        return
    job, target = recipe.job, recipe.job.verify
    assert target is not None, "a replay's assignment names its target"
    key = join_key(checkpoint_prefix(target.job_id, target.attempt, target.to_step), ADAPTER_FILE)
    theirs = load_safetensors(recipe.store.get_bytes(key))
    distances, missing = relative_l2(ours, theirs)
    report = ReplayReport(
        from_step=target.from_step,
        to_step=state.step,
        distances=distances,
        missing=missing,
        losses=state.losses,
        elapsed_s=time.monotonic() - recipe.train_started,
    )
    recipe.store.put_bytes(
        output_replay(job.job_id, job.attempt), report.model_dump_json().encode()
    )
    recipe.reporter.send(reports.Finished(step=state.step, save_s=time.monotonic() - started))

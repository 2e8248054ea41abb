"""A replay's comparison: the adapter it reached against the target's checkpoint.

A replay job (``Assignment.verify``) resumes from the target's committed checkpoint at
``from_step`` with the target's spec, so its data order, RNG streams and LR schedule are the
target's; it trains to ``to_step`` saving nothing, and rank 0 writes a ``ReplayReport`` to the
run's output prefix (``recipe.finish_replay``), which the agent reads and reports in its
``replayed`` event.
"""

from __future__ import annotations

import torch
from safetensors.torch import load as load_safetensors

from swarm_contracts.layout import checkpoint_prefix, join_key
from swarm_contracts.verification import ReplayReport, VerifyTarget
from swarm_runtime.store import ObjectStore
from swarm_trainer.checkpoint import ADAPTER_FILE


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


def replay_report(
    store: ObjectStore,
    target: VerifyTarget,
    ours: dict[str, torch.Tensor],
    losses: dict[int, float],
    elapsed_s: float,
) -> ReplayReport:
    """Compare the replay's adapter at ``target.to_step`` with the target's checkpoint there."""
    key = join_key(checkpoint_prefix(target.job_id, target.attempt, target.to_step), ADAPTER_FILE)
    theirs = load_safetensors(store.get_bytes(key))
    distances, missing = relative_l2(ours, theirs)
    return ReplayReport(
        from_step=target.from_step,
        to_step=target.to_step,
        distances=distances,
        missing=missing,
        losses=losses,
        elapsed_s=elapsed_s,
    )

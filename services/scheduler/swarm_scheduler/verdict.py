"""Verification as pure functions: which jobs, which step range, and whether a replay matches."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from swarm_contracts.verification import ReplayReport


def drawn(fraction: float, rng: random.Random) -> bool:
    """Whether a job that just succeeded is verified: drawn after the fact, so that the worker
    could not have known while it trained."""
    return fraction > 0 and rng.random() < fraction


def pick_range(checkpoints: list[int], rng: random.Random) -> tuple[int, int] | None:
    """A random pair of consecutive committed checkpoints ``a < b``, or None with fewer than
    two: a replay starts at one and is compared at the next."""
    steps = sorted(set(checkpoints))
    pairs = list(itertools.pairwise(steps))
    return rng.choice(pairs) if pairs else None


def loss_differences(replayed: dict[int, float], reported: dict[int, float]) -> dict[int, float]:
    """``|replayed - reported| / |reported|`` for every step both have (absolute against a
    zero loss)."""
    out = {}
    for step in sorted(replayed.keys() & reported.keys()):
        diff, ref = abs(replayed[step] - reported[step]), abs(reported[step])
        out[step] = diff / ref if ref > 0 else diff
    return out


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    max_relative_l2: float
    worst_matrix: str
    max_loss_difference: float | None  # None: no step's loss to compare


def judge(
    report: ReplayReport,
    reported_losses: dict[int, float],
    tolerance: float,
    loss_tolerance: float,
) -> Verdict:
    """A replay matches when every LoRA matrix is within ``tolerance`` (relative L2) of the
    target's, none is missing, and every step's loss the target reported is within
    ``loss_tolerance`` of the replay's. Losses the target never reported (progress events are
    advisory) are not held against it: the weights are the evidence that counts."""
    worst, distance = report.worst
    differences = loss_differences(report.losses, reported_losses)
    max_loss = max(differences.values()) if differences else None
    problems = []
    if report.missing:
        problems.append(f"matrices missing or reshaped: {', '.join(report.missing[:5])}")
    if not report.distances and not report.missing:
        problems.append("no LoRA matrices to compare")
    if distance > tolerance:
        problems.append(
            f"{worst} is {distance:.3g} away (relative L2), more than the tolerance {tolerance:g}"
        )
    if max_loss is not None and max_loss > loss_tolerance:
        step = max(differences, key=lambda s: differences[s])
        problems.append(
            f"step {step} loss {report.losses[step]:.6g} replayed vs {reported_losses[step]:.6g}"
            f" reported, more than the tolerance {loss_tolerance:g}"
        )
    summary = f"steps {report.from_step}→{report.to_step}: "
    if problems:
        reason = summary + "; ".join(problems)
    else:
        losses = (
            f"{len(differences)} losses within {loss_tolerance:g} (largest {max_loss:.2g})"
            if max_loss is not None
            else "no reported losses to compare"
        )
        reason = summary + (
            f"{len(report.distances)} matrices within {tolerance:g} (largest {distance:.2g}), "
            + losses
        )
    return Verdict(not problems, reason, distance, worst, max_loss)

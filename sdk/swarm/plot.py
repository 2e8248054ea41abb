"""``swarm jobs show ID --plot out.png``: the loss and eval-loss curves of a job as a PNG.

matplotlib is optional (``pip install swarm-sdk[plot]``): only this module imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swarm.client import Client
from swarm.errors import ServiceUnavailableError, SwarmError


@dataclass
class LossCurves:
    train: list[tuple[int, float]] = field(default_factory=list)
    eval: list[tuple[int, float]] = field(default_factory=list)


def loss_curves(client: Client, job_id: str) -> LossCurves:
    """From telemetry when it runs; else replayed from a finished job's own events."""
    try:
        m = client.metrics(job_id)
        return LossCurves(
            train=[(p.step, p.loss) for p in m.train], eval=[(p.step, p.eval_loss) for p in m.eval]
        )
    except ServiceUnavailableError:
        if not client.get_job(job_id).state.terminal:
            raise  # replaying a live job's events would follow it until it ends
    curves = LossCurves()
    for ev in client.events(job_id):
        p = ev.payload
        if ev.event == "progress":
            curves.train.append((int(p["step"]), float(p["loss"])))
        elif ev.event == "validated":
            curves.eval.append((int(p["step"]), float(p["eval_loss"])))
    return curves


def write_png(curves: LossCurves, out: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed: we only write a file
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SwarmError(
            "plotting needs matplotlib: pip install 'swarm-sdk[plot]' (or pip install matplotlib)"
        ) from exc
    if not curves.train and not curves.eval:
        raise SwarmError("the job has no loss values to plot yet")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if curves.train:
        ax.plot(*zip(*curves.train, strict=True), label="train loss")
    if curves.eval:
        ax.plot(*zip(*curves.eval, strict=True), marker="o", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)

"""PNG plots: ``swarm jobs show ID --plot out.png`` (a job's loss and eval-loss curves) and
``swarm sweeps show ID --plot out.png`` (a sweep's metric against each searched parameter).

matplotlib is optional (``pip install swarm-sdk[plot]``): only this module imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.client import Client
from swarm.errors import ServiceUnavailableError, SwarmError
from swarm_contracts.sweeps import Choice, IntRange, LogUniform, SweepDetail, TrialRecord


@dataclass
class LossCurves:
    train: list[tuple[int, float]] = field(default_factory=list)
    eval: list[tuple[int, float]] = field(default_factory=list)
    # The task evals' metrics (exact_match...): metric -> (step, value)
    task: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def add_task(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.task.setdefault(name, []).append((step, float(value)))


def loss_curves(client: Client, job_id: str) -> LossCurves:
    """From telemetry when it runs; else replayed from a finished job's own events."""
    try:
        m = client.metrics(job_id)
        found = LossCurves(
            train=[(p.step, p.loss) for p in m.train], eval=[(p.step, p.eval_loss) for p in m.eval]
        )
        for point in m.eval:
            found.add_task(point.step, point.task)
        return found
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
            curves.add_task(int(p["step"]), (p.get("evals") or {}).get("metrics", {}))
    return curves


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed: we only write a file
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SwarmError(
            "plotting needs matplotlib: pip install 'swarm-sdk[plot]' (or pip install matplotlib)"
        ) from exc
    return plt


def write_png(curves: LossCurves, out: Path, title: str) -> None:
    plt = _pyplot()
    if not curves.train and not curves.eval:
        raise SwarmError("the job has no loss values to plot yet")
    # Task metrics (a pass rate, 0 to 1) beside the losses, on their own axes.
    fig, axes = plt.subplots(1, 2 if curves.task else 1, figsize=(13 if curves.task else 8, 4.5))
    ax = axes[0] if curves.task else axes
    if curves.task:
        right = axes[1]
        for name, points in curves.task.items():
            right.plot(*zip(*points, strict=True), marker="o", label=name)
        right.set_xlabel("step")
        right.set_ylabel("task metric")
        right.set_ylim(-0.02, 1.02)
        right.set_title("task evals")
        right.grid(alpha=0.3)
        right.legend()
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


def sweep_points(sweep: SweepDetail) -> list[tuple[TrialRecord, float, bool]]:
    """(trial, metric, final): a finished trial's value, else its last evaluation (a pruned
    or running trial), which ``final`` False marks."""
    points = []
    for trial in sweep.trials:
        if trial.value is not None and math.isfinite(trial.value):
            points.append((trial, trial.value, True))
        elif trial.evals:
            value = trial.evals[max(trial.evals)]
            if math.isfinite(value):
                points.append((trial, value, False))
    return points


def write_sweep_png(sweep: SweepDetail, out: Path) -> None:
    """One scatter per searched parameter: the metric of each trial against its value."""
    plt = _pyplot()
    points = sweep_points(sweep)
    if not points:
        raise SwarmError("the sweep has no evaluated trial to plot yet")
    spec = sweep.spec
    paths = list(spec.search)
    fig, axes = plt.subplots(
        1, len(paths), figsize=(4.2 * len(paths), 4.2), sharey=True, squeeze=False
    )
    best = sweep.best.trial if sweep.best else None
    for ax, path in zip(axes[0], paths, strict=True):
        param = spec.search[path]

        def x_of(trial: TrialRecord, path: str = path, param: Any = param) -> float:
            value = trial.params[path]
            if isinstance(param, Choice):
                return float(next(i for i, v in enumerate(param.values) if v == value))
            return float(value)

        final = [(x_of(t), v) for t, v, done in points if done and t.trial != best]
        partial = [(x_of(t), v) for t, v, done in points if not done]
        if final:
            ax.scatter(*zip(*final, strict=True), label="finished", alpha=0.8)
        if partial:
            ax.scatter(
                *zip(*partial, strict=True),
                marker="x",
                color="grey",
                label="pruned / running (last eval)",
            )
        for t, v, _ in points:
            if t.trial == best:
                ax.scatter([x_of(t)], [v], marker="*", s=220, color="crimson", label="best")
        if isinstance(param, Choice):
            ax.set_xticks(range(len(param.values)), [_label(v) for v in param.values])
            ax.set_xlim(-0.5, len(param.values) - 0.5)
        elif isinstance(param, LogUniform) or (isinstance(param, IntRange) and param.log):
            ax.set_xscale("log")
        ax.set_xlabel(path)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(spec.metric)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"{sweep.sweep_id} ({spec.name}): {spec.metric} by parameter")
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)


def _label(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 18 else text[:17] + "…"

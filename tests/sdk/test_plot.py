"""``swarm jobs show --plot``: the loss curves, and the task metrics beside them."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.plot import LossCurves, write_png

pytest.importorskip("matplotlib")


def curves(task: bool) -> LossCurves:
    found = LossCurves(train=[(1, 2.0), (2, 1.5), (3, 1.2)], eval=[(0, 2.2), (3, 1.3)])
    if task:
        found.add_task(0, {"exact_match": 0.0, "json_valid": 0.1})
        found.add_task(3, {"exact_match": 0.9, "json_valid": 1.0})
    return found


def test_task_metrics_get_their_own_chart_beside_the_losses(tmp_path: Path) -> None:
    with_task = curves(task=True)
    assert with_task.task == {
        "exact_match": [(0, 0.0), (3, 0.9)],
        "json_valid": [(0, 0.1), (3, 1.0)],
    }
    write_png(with_task, tmp_path / "task.png", "job")
    write_png(curves(task=False), tmp_path / "loss.png", "job")
    from PIL import Image

    wide, narrow = (Image.open(tmp_path / n).size for n in ("task.png", "loss.png"))
    assert wide[0] > narrow[0]  # two charts side by side
    assert wide[1] == narrow[1]

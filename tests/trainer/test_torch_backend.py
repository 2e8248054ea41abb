"""Ray Train's torch process group, set up by a driver and a controller that import no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.v2._internal.execution.callback import ControllerCallback

from swarm_trainer.attempt_trainer import AttemptTrainer

HEAVY = ("torch", "transformers", "peft")


class RecordControllerModules(ControllerCallback):
    """Writes which of ``HEAVY`` the run's controller process has imported once it started."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def after_controller_start(self, train_run_context: Any) -> None:
        self.path.write_text(json.dumps([m for m in HEAVY if m in sys.modules]))


def all_reduce_ranks(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    out = Path(config["out"]) / f"rank{dist.get_rank()}.json"
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    out.write_text(json.dumps({"sum": total.item(), "backend": dist.get_backend(), **env}))


@pytest.mark.usefixtures("ray_cluster")
def test_two_ranks_form_a_gloo_group_and_the_controller_imports_no_torch(tmp_path: Path) -> None:
    controller = tmp_path / "controller.json"
    AttemptTrainer(
        all_reduce_ranks,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="backend",
            storage_path=str(tmp_path / "runs"),
            callbacks=[RecordControllerModules(controller)],
        ),
    ).fit()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]  # 1 + 2, seen by both
    assert [r["RANK"] for r in ranks] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"}
    assert {r["backend"] for r in ranks} == {"gloo"}  # no GPU asked
    assert json.loads(controller.read_text()) == []


def test_the_agent_starts_a_run_without_importing_torch_transformers_or_peft() -> None:
    # What the agent imports to run a job (``Attempt`` imports ``run`` for its first one).
    code = f"import sys, swarm_trainer.run; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

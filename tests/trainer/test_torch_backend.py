"""Ray Train's torch process group, set up by a driver and a controller that import no torch.

(On the agent's own Ray every worker is forked from a server that imported torch already:
``swarm_trainer.warm_start``. On a Ray cluster the agent is given, a controller starts cold,
and must not pay for torch: checked on what Ray hands the controller, unpickled in a new
process.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from swarm_trainer.attempt_trainer import AttemptTrainer
from swarm_trainer.torch_backend import rendezvous_address

HEAVY = ("torch", "transformers", "peft")


def all_reduce_ranks(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    out = Path(config["out"]) / f"rank{dist.get_rank()}.json"
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    out.write_text(json.dumps({"sum": total.item(), "backend": dist.get_backend(), **env}))


@pytest.mark.usefixtures("ray_cluster")
def test_two_ranks_form_a_gloo_group(tmp_path: Path) -> None:
    AttemptTrainer(
        all_reduce_ranks,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="backend", storage_path=str(tmp_path / "runs")),
    ).fit()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]  # 1 + 2, seen by both
    assert [r["RANK"] for r in ranks] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"}
    assert {r["backend"] for r in ranks} == {"gloo"}  # no GPU asked


def test_the_rendezvous_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {rendezvous_address()[1] for _ in range(20)}
    assert all(port < low for port in ports)
    assert len(ports) > 1  # drawn at random: two runs on one machine rarely pick the same
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))


class Captured(Exception):
    pass


@pytest.mark.usefixtures("ray_cluster")
def test_what_the_controller_is_given_unpickles_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def capture(self: Any, **kwargs: Any) -> None:
        # All but the training function's object reference, which the controller passes on.
        kwargs.pop("train_fn_ref")
        (tmp_path / "controller.pkl").write_bytes(ray.cloudpickle.dumps(kwargs))
        raise Captured

    monkeypatch.setattr(DataParallelTrainer, "_initialize_and_run_controller", capture)
    trainer = AttemptTrainer(
        all_reduce_ranks,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="backend", storage_path=str(tmp_path / "runs")),
    )
    with pytest.raises(Captured):
        trainer.fit()
    code = (
        "import pickle, sys; import ray.train.v2._internal.execution.controller.controller; "
        f"kwargs = pickle.loads(open({str(tmp_path / 'controller.pkl')!r}, 'rb').read()); "
        f"assert kwargs['callbacks']; print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_agent_starts_a_run_without_importing_torch_transformers_or_peft() -> None:
    # What the agent imports to run a job (``Attempt`` imports ``run`` for its first one).
    code = f"import sys, swarm_trainer.run; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

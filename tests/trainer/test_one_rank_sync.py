"""A group of one rank runs without a synchronization actor; a larger group keeps Ray's."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.v2._internal.execution.checkpoint.sync_actor import SynchronizationActor
from ray.train.v2._internal.execution.worker_group import state as group_state
from ray.train.v2._internal.execution.worker_group import worker_group

from swarm_trainer.attempt_trainer import AttemptTrainer
from swarm_trainer.one_rank_sync import OneRankGroups, OneRankSynchronization


def _synchronizing_loop(config: dict[str, Any]) -> None:
    from ray.train import collective, get_context
    from ray.train.v2._internal.execution.context import get_train_context

    assert isinstance(get_train_context().get_synchronization_actor(), OneRankSynchronization)
    collective.barrier()
    assert collective.broadcast_from_rank_zero({"step": 3}) == {"step": 3}
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "state.txt").write_text("3")
        # report agrees on the checkpoint's directory name through the broadcast
        ray.train.report({"step": 3}, checkpoint=Checkpoint.from_directory(directory))
    assert get_context().get_world_size() == 1


def _sync_actors() -> set[str]:
    return {
        actor_id
        for actor_id, actor in ray._private.state.actors().items()
        if actor["ActorClassName"].endswith("SynchronizationActor")
    }


@pytest.mark.usefixtures("ray_cluster")
def test_a_one_rank_run_synchronizes_and_checkpoints_without_the_actor(tmp_path: Path) -> None:
    before = _sync_actors()
    result = AttemptTrainer(
        _synchronizing_loop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="one-rank", storage_path=str(tmp_path)),
    ).fit()
    assert result.error is None
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert Path(directory, "state.txt").read_text() == "3"
    assert _sync_actors() == before


def test_the_group_s_size_chooses_the_synchronization() -> None:
    # What the callback replaces is where Ray's worker group and its state look it up: a Ray
    # upgrade that moves either fails here.
    original_shutdown = group_state._shutdown_sync_actor
    try:
        callback = OneRankGroups()
        callback.before_worker_group_start(SimpleNamespace(num_workers=1))
        made = worker_group.SynchronizationActor.options(label_selector={}).remote(
            timeout_s=1.0, warn_interval_s=1.0
        )
        assert isinstance(made, OneRankSynchronization)
        group_state._shutdown_sync_actor(made)  # no actor to kill: nothing raised

        callback.before_worker_group_start(SimpleNamespace(num_workers=2))
        assert worker_group.SynchronizationActor is SynchronizationActor
    finally:
        worker_group.SynchronizationActor = SynchronizationActor
        group_state._shutdown_sync_actor = original_shutdown


def test_the_stand_in_refuses_a_second_rank() -> None:
    with pytest.raises(RuntimeError, match="rank 1 of 2"):
        OneRankSynchronization.broadcast_from_rank_zero.answer(
            world_rank=1, world_size=2, data=None, caller_method_name="x"
        )

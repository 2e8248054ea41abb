"""An attempt's Ray Train run starts no actor it has no use for."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import (
    PlacementGroupCleanerCallback,
)

from swarm_trainer.attempt_trainer import AttemptTrainer


def _noop(config: dict[str, object]) -> None:
    pass


def kinds(trainer: AttemptTrainer) -> set[type]:
    return {type(c) for c in trainer._create_default_callbacks()}


def test_the_dataset_manager_and_the_placement_group_cleaner_are_left_out() -> None:
    trainer = AttemptTrainer(_noop, scaling_config=ScalingConfig(num_workers=1))
    callbacks = kinds(trainer)
    assert not callbacks & {DatasetsCallback, PlacementGroupCleanerCallback}
    assert BackendSetupCallback in callbacks  # Ray Train's own setup stays


def test_a_run_given_ray_datasets_keeps_their_callback() -> None:
    # A dataset factory (Ray calls it on the controller): no Ray cluster is needed to build one.
    trainer = AttemptTrainer(
        _noop, scaling_config=ScalingConfig(num_workers=1), datasets={"train": lambda: None}
    )
    assert DatasetsCallback in kinds(trainer)
    assert PlacementGroupCleanerCallback not in kinds(trainer)


@pytest.mark.usefixtures("ray_cluster")  # the agent's kind of Ray (swarm_trainer.own_ray)
def test_a_run_on_the_agent_s_own_ray_asks_no_autoscaler(tmp_path: Path) -> None:
    trainer = AttemptTrainer(
        _noop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="no-autoscaler", storage_path=str(tmp_path)),
    )
    trainer.fit()
    actors = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    assert ("AutoscalingCoordinator", "AutoscalingCoordinator") not in actors, actors

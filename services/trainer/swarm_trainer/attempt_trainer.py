"""Ray Train's ``TorchTrainer`` as an attempt runs it, without what costs a process seconds of
CPU for no use.

Neither the agent (the run's driver) nor the run's controller imports torch, transformers or
peft: the trainer is Ray's ``DataParallelTrainer`` with ``torch_backend.TorchBackendConfig``
(what ``TorchTrainer`` is with Ray's ``TorchConfig``, whose module imports torch), and the
ranks' entry, ``rank_main``, imports the recipe where it runs. About 1.5 CPU-seconds of each
attempt's controller, and 3 of each agent's start.

Nor does it start an actor (a process: about 2 CPU-seconds on a 2-core machine) for no use:

- Ray Data's ``DatasetsCallback`` (a ``DatasetManager`` for every run), even for a run given no
  Ray Datasets. Swarm's ranks read their data from the store themselves
  (``swarm_trainer.stream``); a run given Ray Datasets keeps the callback.
- Ray Train's ``PlacementGroupCleanerCallback`` (a detached ``PlacementGroupCleaner`` for every
  run). It asks Ray's state API, which needs the dashboard an agent's own Ray runs without, so
  there it never removes anything. The agent's ``JobControl`` removes the group instead: after an
  abort (``swarm_trainer.abort``) and after any run, a dead controller's (``JobControl.close``).
- Ray Train's ``SynchronizationActor`` for a group of one rank, which has nobody to wait for
  (``swarm_trainer.one_rank_sync``).
- In the agent's own one-machine Ray (``swarm_trainer.own_ray``), the resource requests to Ray's
  autoscaling coordinator (a detached actor per cluster, polling for as long as it lives): there
  is nothing to scale. A run on a Ray cluster the agent was given (``RAY_ADDRESS``, e.g. KubeRay
  with its autoscaler) keeps them.

``_create_default_callbacks`` and ``_initialize_and_run_controller`` are Ray's own (private)
hooks; ``tests/trainer/test_attempt_trainer.py`` fails if a Ray upgrade renames them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import (
    PlacementGroupCleanerCallback,
)
from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
from ray.train.v2.api.callback import RayTrainCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from swarm_trainer import own_ray
from swarm_trainer.one_rank_sync import OneRankGroups
from swarm_trainer.torch_backend import TorchBackendConfig


def rank_main(config: dict[str, Any]) -> None:
    """Each rank's training function: ``recipe.train_loop``, imported on the rank."""
    from swarm_trainer.recipe import train_loop

    train_loop(config)


class OneMachineScalingPolicy(FixedScalingPolicy):
    """A fixed worker group that asks no autoscaler for its resources."""

    def after_controller_start(self, train_run_context: Any) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass

    def _send_resource_request(self) -> None:
        pass

    def _cancel_resource_request(self) -> None:
        pass


class AttemptTrainer(DataParallelTrainer):
    def __init__(
        self, train_loop_per_worker: Callable[[dict[str, Any]], Any], **kwargs: Any
    ) -> None:
        super().__init__(train_loop_per_worker, backend_config=TorchBackendConfig(), **kwargs)

    def _create_default_callbacks(self) -> list[RayTrainCallback]:
        dropped = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
        kept = [c for c in super()._create_default_callbacks() if not isinstance(c, dropped)]
        return [*kept, OneRankGroups()]

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        policy = controller_init_kwargs.get("scaling_policy")
        if own_ray.started() and type(policy) is FixedScalingPolicy:
            controller_init_kwargs["scaling_policy"] = OneMachineScalingPolicy(self.scaling_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)

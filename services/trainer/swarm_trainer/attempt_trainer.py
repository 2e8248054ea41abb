"""Ray Train's ``TorchTrainer`` as an attempt runs it, without two callbacks that each start an
actor (a process: about 2 CPU-seconds on a 2-core machine) for every run:

- Ray Data's ``DatasetsCallback`` (a ``DatasetManager``), even for a run given no Ray Datasets.
  Swarm's ranks read their data from the store themselves (``swarm_trainer.stream``); a run
  given Ray Datasets keeps the callback.
- Ray Train's ``PlacementGroupCleanerCallback`` (a detached ``PlacementGroupCleaner``). It asks
  Ray's state API, which needs the dashboard an agent's own Ray runs without, so there it
  never removes anything. The run's ``JobControl`` removes the group instead: after an abort
  (``swarm_trainer.abort``) and after any run, a dead controller's (``JobControl.finish``).

``_create_default_callbacks`` is Ray's own (private) hook; ``tests/trainer/test_attempt_trainer.py``
fails if a Ray upgrade renames it or the callback.
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import (
    PlacementGroupCleanerCallback,
)
from ray.train.v2.api.callback import RayTrainCallback


class AttemptTrainer(TorchTrainer):
    def _create_default_callbacks(self) -> list[RayTrainCallback]:
        dropped = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
        return [c for c in super()._create_default_callbacks() if not isinstance(c, dropped)]

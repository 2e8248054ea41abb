"""Ray Train's ``TorchTrainer`` as an attempt runs it: without Ray Data's ``DatasetsCallback``,
which starts a ``DatasetManager`` actor (a process: about 1.4 CPU-seconds on a 2-core machine)
for every run, even one given no Ray Datasets. Swarm's ranks read their data from
the store themselves (``swarm_trainer.stream``); a run given Ray Datasets keeps the callback.

Ray Train's placement-group cleaner stays: a second line of defence, beside ``JobControl``,
for the placement group of a run killed while it starts (``swarm_trainer.abort``).

``_create_default_callbacks`` is Ray's own (private) hook; ``tests/trainer/test_attempt_trainer.py``
fails if a Ray upgrade renames it or the callback.
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2.api.callback import RayTrainCallback


class AttemptTrainer(TorchTrainer):
    def _create_default_callbacks(self) -> list[RayTrainCallback]:
        callbacks = super()._create_default_callbacks()
        if self.datasets:
            return callbacks
        return [c for c in callbacks if not isinstance(c, DatasetsCallback)]

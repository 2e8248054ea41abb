"""The hook that lets an attempt's Ray Train run be aborted at any point of its start.

A cancel is a flag the training loop polls every step (``control.JobControl``); before the loop
runs (Ray starting the controller and the worker group, the ranks importing torch and loading
the model: tens of seconds on a loaded machine) nothing polls it. So the run's controller
gives the job's ``JobControl`` its own handle as it starts, and ``JobControl.abort`` kills it
(the ranks, which it owns, go with it; Ray Train's placement-group cleaner frees their
resources), whether it is asked before or after the controller got there.

Its own module: the controller process unpickles this callback, and ``control`` is imported
by the ``JobControl`` actor, which must not pay for importing Ray Train.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback


class RegisterController(ControllerCallback):
    def __init__(self, control: Any) -> None:
        self.control = control

    def after_controller_start(self, train_run_context: Any) -> None:
        self.control.set_controller.remote(ray.get_runtime_context().current_actor)

"""The hook that lets an attempt's Ray Train run be aborted at any point of its start.

A cancel is a flag the training loop polls every step (``control.JobControl``); before the loop
runs (Ray starting the controller and the worker group, the ranks importing torch and loading
the model: tens of seconds on a loaded machine) nothing polls it. So the run's controller
gives the job's ``RunControl`` its own handle as it starts, and ``JobControl.abort`` kills it
(the ranks, which it owns, go with it), whether it is asked before or after the controller got
there.

The worker group's placement group is handed over too, and removed by ``JobControl`` after
the kill (which waits for it while the group starts), so that the killed run's CPUs do not stay
reserved, leaving the next attempt placed on this worker waiting for them. A kill takes
effect a little after it is asked, so a controller told that its run was aborted as it is about
to create the group (``JobControl.group_starting``) waits for its end instead: a group created
in that moment would be known to nobody (seen under load: left reserved for good). A
controller that died by itself left its group too: ``JobControl.close`` removes it once the
run is over (Ray Train's own ``PlacementGroupCleaner`` cannot here: ``AttemptTrainer``).

Its own module: the controller process unpickles this callback, and ``control`` is imported
by the ``JobControl`` actor, which must not pay for importing Ray Train.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

ABORTED_WAIT_S = 1.0


class RegisterController(ControllerCallback, WorkerGroupCallback):
    def __init__(self, control: Any) -> None:
        self.control = control

    def after_controller_start(self, train_run_context: Any) -> None:
        self.control.set_controller(ray.get_runtime_context().current_actor)

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        # An aborted run's controller is being killed, and a kill takes effect a little later:
        # it must not create a placement group meanwhile, which nobody would remove. So it
        # waits here for the kill (or fails here if the control actor is gone).
        while ray.get(self.control.group_starting()):
            time.sleep(ABORTED_WAIT_S)

    def after_worker_group_start(self, worker_group: Any) -> None:
        state = worker_group.get_worker_group_state()
        # Waited for: a kill right after this returns must find the group to remove.
        placement_group = state.placement_group_handle.placement_group
        ray.get(self.control.add_placement_group(placement_group))

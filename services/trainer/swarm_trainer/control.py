"""The channel between a running job's rank 0 and the agent: reports out, cancel in.

One ``JobControl`` actor per agent serves all its runs, each under its own key: an actor is a
process (a second and a half of CPU to start on a loaded 2-core machine), which a run need
not pay for. A run's end of it is a ``RunControl``: the actor's handle and the run's key,
picklable, so the run's controller and rank 0 get it through the loop config.

A stop comes in two kinds: ``CANCEL`` (stop now, save nothing) and ``RELEASE`` (commit a
checkpoint of the current step, then stop: the job is handed back and resumes elsewhere).

Ray imports this module in the ``JobControl`` actor's process, so it imports Ray only (torch
and peft would cost that process seconds of start-up); rank 0's end is ``reporter.Reporter``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import ray

from swarm_trainer.reports import Report

# Reports are advisory; checkpoints and results go to the store, so a full queue only ever
# costs events, never correctness (the agent takes them every half second).
QUEUE_SIZE = 10_000
# How often the agent asks for reports while it waits for one.
TAKE_POLL_S = 0.1
CANCEL = 1
RELEASE = 2
# How long an abort waits at most for a starting worker group to hand over its placement group
# before it kills the controller anyway (leaving the group's CPUs reserved): starting the ranks
# (importing torch, initialising the train context) takes minutes on a loaded machine, beyond
# Ray Train's own 60 s for the placement group alone.
GROUP_START_WAIT_S = 300.0
FINISH_WAIT_S = 10.0
# How long ``make_control`` waits for the agent's JobControl to answer before starting another.
ALIVE_WAIT_S = 10.0
# Closed runs remembered (as aborted) for their late calls: far more than run at once.
CLOSED_KEPT = 1000


# One thread, no method that blocks: Ray runs a single-threaded actor's calls in the order each
# caller sent them, which the stop's methods rely on (a threaded actor's need not be).
@ray.remote(num_cpus=0)
class JobControl:
    """Per run: rank 0's reports on their way to the agent; a stop flag the training loop
    polls every step (a few ms of Ray round trip); and the run's Ray Train controller, to abort
    the run while no loop polls yet (``abort``)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        # Runs closed lately, as aborted: an aborted run's controller may still be starting
        # after the agent let go, and is killed when it calls in.
        self._closed: OrderedDict[str, _Run] = OrderedDict()

    def _run(self, key: str) -> _Run:
        if (closed := self._closed.get(key)) is not None:
            return closed
        # A run's first call makes its state.
        return self._runs.setdefault(key, _Run())

    def put(self, key: str, report: Report) -> None:
        """Queue a report for the agent; dropped when ``QUEUE_SIZE`` wait already."""
        reports = self._run(key).reports
        if len(reports) < QUEUE_SIZE:
            reports.append(report)

    def take(self, key: str) -> list[Report]:
        """Every report queued so far, oldest first."""
        reports = self._run(key).reports
        items = list(reports)
        reports.clear()
        return items

    def cancel(self, key: str) -> None:
        self._run(key).mode = CANCEL

    def release(self, key: str) -> None:
        run = self._run(key)
        # A cancel already asked for wins: nothing is to be saved then.
        run.mode = run.mode or RELEASE

    def stop_mode(self, key: str) -> int:
        """0 (go on), ``CANCEL`` or ``RELEASE``."""
        return self._run(key).mode

    def set_controller(self, key: str, controller: Any) -> None:
        """The run's controller says it started (``swarm_trainer.abort``)."""
        run = self._run(key)
        run.controller = controller
        if run.aborted:  # asked before the controller was there
            run.kill()

    def group_starting(self, key: str) -> bool:
        """The controller is about to create the worker group's placement group: if the run
        was aborted meanwhile (a start that failed and is retried, or an abort before the
        controller was there), it is killed now, before there is a group to leave behind, and
        the answer (True) tells it not to create one while the kill takes effect."""
        run = self._run(key)
        run.group_starting = True
        if run.aborted:
            run.kill()
        return run.aborted

    def add_placement_group(self, key: str, placement_group: Any) -> None:
        """The run's worker group started in ``placement_group`` (``swarm_trainer.abort``)."""
        run = self._run(key)
        run.group_starting = False
        run.placement_groups.append(placement_group)
        if run.aborted:  # an abort waited for it
            run.kill()

    def abort(self, key: str) -> None:
        """Stop the run now, wherever it is: the controller is killed (and with it the
        ranks, which it owns) now or as soon as it starts.

        While the worker group starts, its placement group exists but is not known here yet:
        the kill waits until it is (``add_placement_group``), or the start is retried
        (``group_starting``), as removing it is the only way to give its CPUs back; or
        ``GROUP_START_WAIT_S`` at most. Nobody waits on the kill: the agent has reported the
        stop and let go of the job already."""
        run = self._run(key)
        run.mode, run.aborted = CANCEL, True
        if run.group_starting:
            threading.Timer(GROUP_START_WAIT_S, run.kill).start()
        else:
            run.kill()

    def close(self, key: str) -> None:
        """The run is over. A controller that shut down by itself removed its group; one that
        died did not, and nothing else would until the agent exits (Ray Train's own cleaner
        needs Ray's state API, which a cluster without the dashboard lacks). From now on the
        run counts as aborted, should anything of it still call in."""
        run = self._runs.pop(key, None)
        if run is None:
            return
        if not run.group_starting:
            run.remove_placement_groups()
        run.mode, run.aborted = CANCEL, True
        run.reports.clear()
        self._closed[key] = run
        while len(self._closed) > CLOSED_KEPT:
            self._closed.popitem(last=False)

    def open_runs(self) -> int:
        """How many runs it holds state for that were not closed."""
        return len(self._runs)


class _Run:
    def __init__(self) -> None:
        self.reports: deque[Report] = deque()
        self.mode = 0
        self.controller: Any = None
        self.placement_groups: list[Any] = []
        self.group_starting = False
        self.aborted = False

    def kill(self) -> None:
        if self.controller is not None:
            with contextlib.suppress(Exception):  # already dead (a second kill)
                ray.kill(self.controller, no_restart=True)
        self.remove_placement_groups()

    def remove_placement_groups(self) -> None:
        # A killed controller leaves its placement group (a driver-scoped resource) behind.
        from ray.util.placement_group import remove_placement_group

        for placement_group in self.placement_groups:
            # Already removed if the controller got to shut down by itself.
            with contextlib.suppress(Exception):
                remove_placement_group(placement_group)
        self.placement_groups.clear()


@dataclass(frozen=True)
class RunControl:
    """One run's end of the agent's ``JobControl``: each method sends the call (with the
    run's key) and returns its ``ObjectRef``."""

    actor: Any
    key: str

    def put(self, report: Report) -> Any:
        return self.actor.put.remote(self.key, report)

    def take(self) -> Any:
        return self.actor.take.remote(self.key)

    def cancel(self) -> Any:
        return self.actor.cancel.remote(self.key)

    def release(self) -> Any:
        return self.actor.release.remote(self.key)

    def stop_mode(self) -> Any:
        return self.actor.stop_mode.remote(self.key)

    def set_controller(self, controller: Any) -> Any:
        return self.actor.set_controller.remote(self.key, controller)

    def group_starting(self) -> Any:
        return self.actor.group_starting.remote(self.key)

    def add_placement_group(self, placement_group: Any) -> Any:
        return self.actor.add_placement_group.remote(self.key, placement_group)

    def abort(self) -> Any:
        return self.actor.abort.remote(self.key)

    def close(self) -> Any:
        return self.actor.close.remote(self.key)


# This process's JobControl, and the Ray cluster it lives in (a new cluster needs a new one).
_actor: tuple[str, Any] | None = None
_actor_lock = threading.Lock()


def make_control() -> RunControl:
    """A new run's control, on this process's ``JobControl``: started with the first run, and
    again should it have died (one dead actor must not fail every later run)."""
    global _actor
    cluster = ray.get_runtime_context().gcs_address
    with _actor_lock:
        if _actor is None or _actor[0] != cluster or not responsive(_actor[1]):
            _actor = (cluster, JobControl.remote())  # type: ignore[attr-defined]
        actor = _actor[1]
    return RunControl(actor, uuid.uuid4().hex)


def responsive(actor: Any) -> bool:
    # A live one answers in milliseconds; one too busy to answer in time is left to the runs
    # it has (a second actor costs a process, not correctness).
    try:
        ray.get(actor.open_runs.remote(), timeout=ALIVE_WAIT_S)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def drain(control: RunControl, wait_s: float) -> list[Report]:
    """Everything rank 0 has sent so far, waiting up to ``wait_s`` for the first report."""
    deadline = time.monotonic() + wait_s
    while True:
        reports: list[Report] = ray.get(control.take())
        if reports or time.monotonic() >= deadline:
            return reports
        time.sleep(min(TAKE_POLL_S, max(0.0, deadline - time.monotonic())))


def close_control(control: RunControl) -> None:
    """Forget a run that is over, once ``JobControl`` removed what its controller may have
    left."""
    with contextlib.suppress(Exception):
        ray.get(control.close(), timeout=FINISH_WAIT_S)

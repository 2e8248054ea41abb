"""The channel between a running job's rank 0 and the agent: reports out, cancel in, both
through the job's one ``JobControl`` actor (an actor is a process: one per attempt, not two).

A stop comes in two kinds: ``CANCEL`` (stop now, save nothing) and ``RELEASE`` (commit a
checkpoint of the current step, then stop: the job is handed back and resumes elsewhere).

Ray imports this module in the ``JobControl`` actor's process, so it imports Ray only (torch
and peft would cost that process seconds of start-up); rank 0's end is ``reporter.Reporter``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
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


# One thread, no method that blocks: Ray runs a single-threaded actor's calls in the order each
# caller sent them, which the stop's methods rely on (a threaded actor's need not be).
@ray.remote(num_cpus=0)
class JobControl:
    """Rank 0's reports on their way to the agent; a stop flag the training loop polls every
    step (a few ms of Ray round trip); and the run's Ray Train controller, to abort the run
    while no loop polls yet (``abort``)."""

    def __init__(self) -> None:
        self._reports: deque[Report] = deque()
        self._mode = 0
        self._controller: Any = None
        self._placement_groups: list[Any] = []
        self._group_starting = False
        self._aborted = False

    def put(self, report: Report) -> None:
        """Queue a report for the agent; dropped when ``QUEUE_SIZE`` wait already."""
        if len(self._reports) < QUEUE_SIZE:
            self._reports.append(report)

    def take(self) -> list[Report]:
        """Every report queued so far, oldest first."""
        items = list(self._reports)
        self._reports.clear()
        return items

    def cancel(self) -> None:
        self._mode = CANCEL

    def set_controller(self, controller: Any) -> None:
        """The run's controller says it started (``swarm_trainer.abort``)."""
        self._controller = controller
        if self._aborted:  # asked before the controller was there
            self._kill()

    def group_starting(self) -> bool:
        """The controller is about to create the worker group's placement group: if the run
        was aborted meanwhile (a start that failed and is retried, or an abort before the
        controller was there), it is killed now, before there is a group to leave behind, and
        the answer (True) tells it not to create one while the kill takes effect."""
        self._group_starting = True
        if self._aborted:
            self._kill()
        return self._aborted

    def add_placement_group(self, placement_group: Any) -> None:
        """The run's worker group started in ``placement_group`` (``swarm_trainer.abort``)."""
        self._group_starting = False
        self._placement_groups.append(placement_group)
        if self._aborted:  # an abort waited for it
            self._kill()

    def abort(self) -> None:
        """Stop the run now, wherever it is: the controller is killed (and with it the
        ranks, which it owns) now or as soon as it starts.

        While the worker group starts, its placement group exists but is not known here yet:
        the kill waits until it is (``add_placement_group``), or the start is retried
        (``group_starting``), as removing it is the only way to give its CPUs back; or
        ``GROUP_START_WAIT_S`` at most. Nobody waits on the kill: the agent has reported the
        stop and let go of the job already."""
        self._mode, self._aborted = CANCEL, True
        if self._group_starting:
            threading.Timer(GROUP_START_WAIT_S, self._kill).start()
        else:
            self._kill()

    def _kill(self) -> None:
        if self._controller is not None:
            with contextlib.suppress(Exception):  # already dead (a second kill)
                ray.kill(self._controller, no_restart=True)
        self._remove_placement_groups()

    def _remove_placement_groups(self) -> None:
        # A killed controller leaves its placement group (a driver-scoped resource) behind.
        from ray.util.placement_group import remove_placement_group

        for placement_group in self._placement_groups:
            # Already removed if the controller got to shut down by itself.
            with contextlib.suppress(Exception):
                remove_placement_group(placement_group)
        self._placement_groups.clear()

    def finish(self) -> None:
        """The run is over. A controller that shut down by itself removed its group; one that
        died did not, and nothing else would until the agent exits (Ray Train's own cleaner
        needs Ray's state API, which a cluster without the dashboard lacks)."""
        if not self._group_starting:
            self._remove_placement_groups()

    def release(self) -> None:
        # A cancel already asked for wins: nothing is to be saved then.
        self._mode = self._mode or RELEASE

    def cancelled(self) -> bool:
        return self._mode != 0

    def stop_mode(self) -> int:
        """0 (go on), ``CANCEL`` or ``RELEASE``."""
        return self._mode


def make_control() -> Any:
    """The ``JobControl`` actor of one run, in the local Ray cluster."""
    return JobControl.remote()  # type: ignore[attr-defined]


def drain(control: Any, wait_s: float) -> list[Report]:
    """Everything rank 0 has sent so far, waiting up to ``wait_s`` for the first report."""
    deadline = time.monotonic() + wait_s
    while True:
        reports: list[Report] = ray.get(control.take.remote())
        if reports or time.monotonic() >= deadline:
            return reports
        time.sleep(min(TAKE_POLL_S, max(0.0, deadline - time.monotonic())))


def close_control(control: Any) -> None:
    """Kill the run's ``JobControl``, once the run is over, after it removed what the run's
    controller may have left."""
    with contextlib.suppress(Exception):
        ray.get(control.finish.remote(), timeout=FINISH_WAIT_S)
    ray.kill(control)

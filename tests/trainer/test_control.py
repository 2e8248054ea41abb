"""One ``JobControl`` per agent keeps each run's reports and stop apart, and removes what a
run's controller left behind once the run is over."""

from __future__ import annotations

import time

import pytest

from swarm_trainer.control import (
    CANCEL,
    RELEASE,
    close_control,
    drain,
    make_control,
    responsive,
)
from swarm_trainer.reports import Started


def _state(placement_group: object) -> str:
    from ray.util import placement_group_table

    return placement_group_table(placement_group)["state"]


@pytest.mark.usefixtures("ray_cluster")
def test_runs_share_one_actor_and_keep_their_reports_and_stops_apart() -> None:
    import ray

    first, second = make_control(), make_control()
    assert first.actor._actor_id == second.actor._actor_id  # one process for every run
    ray.get(first.put(Started(resumed_from_step=1)))
    ray.get(second.put(Started(resumed_from_step=2)))
    ray.get(first.put(Started(resumed_from_step=3)))
    ray.get(second.release())
    assert [r.resumed_from_step for r in drain(first, 0.0)] == [1, 3]
    assert [r.resumed_from_step for r in drain(second, 0.0)] == [2]
    assert (ray.get(first.stop_mode()), ray.get(second.stop_mode())) == (0, RELEASE)
    ray.get(first.cancel())
    ray.get(first.release())  # a cancel asked first wins
    assert ray.get(first.stop_mode()) == CANCEL

    open_before = ray.get(first.actor.open_runs.remote())
    close_control(first)
    close_control(second)
    assert ray.get(first.actor.open_runs.remote()) == open_before - 2
    # Anything of a closed run that still calls in is told to stop.
    assert ray.get(second.stop_mode()) == CANCEL
    assert ray.get(second.group_starting()) is True


@pytest.mark.usefixtures("ray_cluster")
def test_a_dead_job_control_is_replaced_for_the_next_run() -> None:
    import ray

    dead = make_control()
    ray.kill(dead.actor)
    # A kill takes effect a little later: the actor is dead once a call says so.
    deadline = time.monotonic() + 30
    while responsive(dead.actor):
        assert time.monotonic() < deadline, "the killed JobControl still answers"
        time.sleep(0.05)
    control = make_control()
    assert control.actor._actor_id != dead.actor._actor_id
    ray.get(control.put(Started(resumed_from_step=5)))
    assert [r.resumed_from_step for r in drain(control, 0.0)] == [5]
    close_control(control)


@pytest.mark.usefixtures("ray_cluster")
def test_a_dead_controller_s_placement_group_is_removed_when_the_run_is_closed() -> None:
    import ray
    from ray.util.placement_group import placement_group

    # What a worker group holds: its controller died without removing it (a crash, an OOM),
    # and Ray Train's own cleaner is not started (swarm_trainer.attempt_trainer).
    group = placement_group([{"CPU": 1}])
    ray.get(group.ready(), timeout=60)
    control = make_control()
    ray.get(control.add_placement_group(group))
    assert _state(group) == "CREATED"

    close_control(control)

    deadline = time.monotonic() + 30
    while _state(group) != "REMOVED":
        assert time.monotonic() < deadline, _state(group)
        time.sleep(0.1)

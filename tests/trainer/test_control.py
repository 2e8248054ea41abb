"""``JobControl`` removes what a run's controller left behind once the run is over."""

from __future__ import annotations

import time

import pytest

from swarm_trainer.control import close_control, make_control


def _state(placement_group: object) -> str:
    from ray.util import placement_group_table

    return placement_group_table(placement_group)["state"]


@pytest.mark.usefixtures("ray_cluster")
def test_a_dead_controller_s_placement_group_is_removed_when_the_run_is_closed() -> None:
    import ray
    from ray.util.placement_group import placement_group

    # What a worker group holds: its controller died without removing it (a crash, an OOM),
    # and Ray Train's own cleaner is not started (swarm_trainer.attempt_trainer).
    group = placement_group([{"CPU": 1}])
    ray.get(group.ready(), timeout=60)
    control = make_control()
    ray.get(control.add_placement_group.remote(group))
    assert _state(group) == "CREATED"

    close_control(control)

    deadline = time.monotonic() + 30
    while _state(group) != "REMOVED":
        assert time.monotonic() < deadline, _state(group)
        time.sleep(0.1)

"""The session lane's GPU (swarm_trainer.session_lane): held in the agent's Ray while the worker
holds sessions, so that Ray gives no job's rank that GPU. Ray counts GPUs it is told of, so a
Ray of two made-up GPUs shows it on a machine without any."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from swarm_trainer.session_lane import visible_index

pytestmark = pytest.mark.slow


def test_ray_s_gpu_id_is_found_among_the_visible_devices() -> None:
    assert visible_index("1", None) == 1
    assert visible_index("3", "") == 3
    assert visible_index("6", "4,6,7") == 1  # Ray's ids are the listed ones
    with pytest.raises(ValueError, match="not among CUDA_VISIBLE_DEVICES=4,6"):
        visible_index("5", "4,6")


# Run in a fresh process: this test's Ray has GPUs, the suite's shared one has none.
SCRIPT = """
import json, ray
from swarm_trainer import own_ray
from swarm_trainer.session_lane import GpuLane

own_ray.start(3, worker_logs=False, warm_start=False, gpus=2)

@ray.remote(num_gpus=1)
def rank_gpu():
    return str(ray.get_gpu_ids()[0])

@ray.remote(num_gpus=2)
def both():
    return "ran"

lane = GpuLane()
out = {"device": lane.device(), "again": lane.device(), "rank": ray.get(rank_gpu.remote())}
blocked = both.remote()
ready, _ = ray.wait([blocked], timeout=3)
out["both_while_held"] = bool(ready)
lane.release()
out["both_after"] = ray.get(blocked, timeout=60)
print(json.dumps(out))
own_ray.stop()
"""


def test_the_lane_holds_its_gpu_in_ray_until_released() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["device"] in ("cuda:0", "cuda:1")
    assert out["again"] == out["device"]  # one GPU for all the worker's sessions
    # A job's rank gets the other GPU, and a job needing both waits until the lane lets go.
    assert f"cuda:{out['rank']}" != out["device"]
    assert out["both_while_held"] is False
    assert out["both_after"] == "ran"

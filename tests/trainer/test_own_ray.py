"""A trainer agent starts a Ray of its own: it never attaches to another Ray on the host (a
second stack's agent, someone's `ray start`), which Ray's discovery would hand it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs _init_ray as the agent does, then prints the address of the Ray it got.
PROBE = """
import types, ray
from swarm_trainer.agent import TrainerAgent
agent = types.SimpleNamespace(resources=types.SimpleNamespace(cpus=1), _own_ray=False)
TrainerAgent._init_ray(agent)
print("GCS", ray.get_runtime_context().gcs_address, flush=True)
ray.shutdown()
"""


def test_the_agent_ignores_the_ray_that_ray_start_left_on_the_host() -> None:
    # A short temp root (Ray's socket paths must fit 107 bytes) holding what `ray start`
    # leaves behind: the address of "the latest cluster", here one nobody answers on.
    root = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    (root / "ray").mkdir()
    (root / "ray" / "ray_current_cluster").write_text("127.0.0.1:9\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(root)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the agent waited on the other Ray: {exc.stderr!r}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    gcs = next(line for line in done.stdout.splitlines() if line.startswith("GCS "))
    assert not gcs.endswith(":9"), gcs

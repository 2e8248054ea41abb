"""A trainer agent starts a Ray of its own: it never attaches to another Ray on the host (a
second stack's agent, someone's `ray start`), which Ray's discovery would hand it; and it runs
no Ray process a trainer has no use for (swarm_trainer.own_ray)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs _init_ray as the agent does, then prints the address of the Ray it got and the
# processes it started.
PROBE = """
import sys, types, psutil, ray
from swarm_trainer import own_ray
from swarm_trainer.agent import TrainerAgent
agent = types.SimpleNamespace(
    resources=types.SimpleNamespace(cpus=1, gpus=["a GPU"] if "gpu" in sys.argv else []),
    settings=types.SimpleNamespace(ray_worker_logs=sys.argv[1] == "logs", ray_warm_start=True),
    _own_ray=False,
)
TrainerAgent._init_ray(agent)
print("GCS", ray.get_runtime_context().gcs_address, flush=True)
for child in psutil.Process().children(recursive=True):
    print("PROCESS", " ".join(child.cmdline()), flush=True)
own_ray.stop()
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
            [sys.executable, "-c", PROBE, "quiet"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the agent waited on the other Ray: {exc.stderr!r}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    gcs = next(line for line in done.stdout.splitlines() if line.startswith("GCS "))
    assert not gcs.endswith(":9"), gcs


def ray_processes(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("PROCESS ")]


def test_the_agent_s_ray_runs_no_monitor_nor_api_server_and_logs_only_when_asked() -> None:
    quiet = ray_processes("quiet")
    assert any("gcs_server" in p for p in quiet), quiet
    assert any("raylet" in p for p in quiet), quiet
    assert not [p for p in quiet if "monitor.py" in p], quiet  # neither monitor
    assert not [p for p in quiet if "dashboard.py" in p], quiet  # nor the API server
    with_logs = ray_processes("logs")
    assert [p for p in with_logs if "log_monitor.py" in p], with_logs
    assert not [p for p in with_logs if "autoscaler" in p and "monitor.py" in p], with_logs


def test_the_agent_s_ray_forks_its_workers_warm_only_on_a_machine_without_gpus() -> None:
    assert [p for p in ray_processes("quiet") if "swarm_trainer.warm_start" in p]
    assert not [p for p in ray_processes("quiet", "gpu") if "swarm_trainer.warm_start" in p]

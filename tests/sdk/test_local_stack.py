"""`swarm up`: the local stack as real processes, and a clean stop on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from swarm import local_stack
from swarm.local_stack import LocalStack, StackError
from swarm_common.settings import Settings

from ..conftest import free_port

pytestmark = pytest.mark.slow


def test_swarm_up_serves_and_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    gateway_port = free_port()
    env = os.environ | {
        "SWARM_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "SWARM_GATEWAY_PORT": str(gateway_port),
        "SWARM_TELEMETRY_PORT": str(free_port()),
        "SWARM_TRAINER_CPUS": "1",
    }
    swarm = Path(sys.executable).with_name("swarm")
    proc = subprocess.Popen([str(swarm), "up", "--root", str(tmp_path / ".swarm")], env=env)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "swarm up exited early"
            assert time.monotonic() < deadline, "gateway never became healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{gateway_port}/healthz", timeout=1).is_success:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        children = psutil.Process(proc.pid).children(recursive=True)
        commands = " ".join(" ".join(c.cmdline()) for c in children)
        for name in (
            "nats-server",
            "swarm_gateway",
            "swarm_scheduler",
            "swarm_trainer",
            "swarm_registry",
            "swarm_telemetry",
        ):
            assert name in commands
        # The trainer heartbeats through the whole chain: it shows up as a worker.
        while not httpx.get(f"http://127.0.0.1:{gateway_port}/v1/workers").json()["data"]:
            assert time.monotonic() < deadline, "no worker appeared"
            time.sleep(0.5)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        _, alive = psutil.wait_procs(children, timeout=20)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_missing_nats_server_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_stack, "find_nats_server", lambda: None)
    stack = LocalStack(tmp_path, settings=Settings(nats_url=f"nats://127.0.0.1:{free_port()}"))
    with pytest.raises(StackError, match="apt-get install nats-server"):
        stack.start()
    assert stack.procs == {}

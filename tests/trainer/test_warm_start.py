"""Ray's workers forked from the agent's fork server (``swarm_trainer.warm_start``): started as
``python`` would start them, ended as they would end, and cold where the server cannot serve."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from swarm_trainer import own_ray, warm_start

# A stand-in for Ray's default_worker.py: says where and how it runs, then does as told.
WORKER = """
import json, os, sys, time
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
    "argv": sys.argv, "path": sys.path, "seen": os.environ.get("SEEN"),
    "warm": "email.mime.text" in sys.modules,
}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "raise":
    raise RuntimeError("the worker failed")
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def server() -> Iterator[warm_start.WarmStart]:
    # Warmed with a module the fake worker never imports, to tell a forked start from a cold one.
    started = warm_start.start(("email.mime.text",))
    yield started
    started.stop()


def stand_in(
    socket_path: Path, worker: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    client = Path(warm_start.__file__).with_name("warm_exec.py")
    return subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            str(client),
            "--stand-in",
            str(socket_path),
            str(worker),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=worker.parent,
        env={**os.environ, "SEEN": "yes", **(env or {})},
        process_group=0,  # as Ray starts a worker: a process group of its own
    )


def report(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    return json.loads(proc.stdout.readline())


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def test_a_forked_worker_runs_as_python_would_and_its_exit_is_its_stand_in_s(
    server: warm_start.WarmStart, worker: Path
) -> None:
    proc = stand_in(server.socket_path, worker, "exit", "7")
    seen = report(proc)
    assert proc.wait(30) == 7
    assert seen["ppid"] == server.process.pid
    assert seen["pid"] != proc.pid
    assert seen["warm"] is True
    assert seen["pgid"] == proc.pid  # its stand-in's group, not the server's
    assert seen["argv"] == [str(worker), "exit", "7"]
    assert seen["cwd"] == str(worker.parent)
    # The script's directory where a cold start puts it: where ``-m`` put the server's.
    assert str(worker.parent) in seen["path"]  # type: ignore[operator]
    assert os.getcwd() not in seen["path"]  # type: ignore[operator]
    assert seen["seen"] == "yes"  # the stand-in's environment, not the server's


def test_a_worker_that_fails_prints_why_and_exits_as_python_would(
    server: warm_start.WarmStart, worker: Path
) -> None:
    proc = stand_in(server.socket_path, worker, "raise", "0")
    assert report(proc)["warm"] is True
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "RuntimeError: the worker failed" in err


def test_a_signal_to_the_stand_in_reaches_the_worker_and_a_kill_takes_both(
    server: warm_start.WarmStart, worker: Path
) -> None:
    proc = stand_in(server.socket_path, worker, "sleep", "0")
    report(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM  # the worker died of it, and so did its stand-in

    proc = stand_in(server.socket_path, worker, "sleep", "0")
    child = int(report(proc)["pid"])  # type: ignore[call-overload]
    proc.kill()
    proc.wait(30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}") and "Z" not in status(child):
        assert time.monotonic() < deadline, "the worker outlived its stand-in"
        time.sleep(0.05)


def status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except OSError:
        return "Z"


def test_without_a_server_or_for_another_job_the_worker_starts_cold(
    server: warm_start.WarmStart, worker: Path, tmp_path: Path
) -> None:
    proc = stand_in(tmp_path / "no.sock", worker, "exit", "3")
    seen = report(proc)
    assert proc.wait(30) == 3
    assert seen["pid"] == proc.pid
    assert seen["warm"] is False

    first = stand_in(server.socket_path, worker, "exit", "0", env={"RAY_JOB_ID": "01000000"})
    assert report(first)["warm"] is True
    first.wait(30)
    # Ray's C++ side read the job's id once, as the server imported Ray: not another job's.
    other = stand_in(server.socket_path, worker, "exit", "0", env={"RAY_JOB_ID": "02000000"})
    seen = report(other)
    assert seen["pid"] == other.pid
    assert seen["warm"] is False
    other.wait(30)


def test_a_server_that_does_not_answer_in_time_gets_a_cold_start(
    worker: Path, tmp_path: Path
) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen()
    proc = stand_in(
        tmp_path / "silent.sock", worker, "exit", "4", env={"SWARM_WARM_START_WAIT_S": "1"}
    )
    seen = report(proc)
    assert proc.wait(30) == 4
    assert seen["pid"] == proc.pid
    silent.close()


def test_no_module_beside_warm_exec_shadows_the_standard_library() -> None:
    # Ray runs warm_exec.py by path, which puts its directory first on the path.
    here = Path(warm_start.__file__).parent
    names = {p.stem for p in here.glob("*.py")} | {p.name for p in here.iterdir() if p.is_dir()}
    assert not names & set(sys.stdlib_module_names)


@ray.remote
class Probe:
    def describe(self) -> dict[str, object]:
        import numpy

        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "torch": "torch" in sys.modules,
            "draw": float(numpy.random.random()),
            # Ray's IDs (a placement group's, an actor's) come from its C++ side's generator.
            "id": ray._raylet.UniqueID.from_random().hex(),
            "env": os.environ.get("PROBE"),
            # Its stand-in leads its process group: Ray started it.
            "stand_in": Path(f"/proc/{os.getpgid(0)}/cmdline").read_bytes().split(b"\0"),
        }


@pytest.mark.usefixtures("ray_cluster")
def test_the_agent_s_ray_forks_its_workers_warm_and_kills_them_as_usual() -> None:
    assert own_ray.started()
    probes = [Probe.options(runtime_env={"env_vars": {"PROBE": "1"}}).remote() for _ in range(2)]
    seen = ray.get([p.describe.remote() for p in probes])
    assert all(s["torch"] for s in seen)  # imported before the worker started
    assert seen[0]["ppid"] == seen[1]["ppid"] != os.getpid()  # the fork server
    assert seen[0]["draw"] != seen[1]["draw"]  # NumPy seeded afresh in each
    assert seen[0]["id"] != seen[1]["id"]  # and Ray's generator never drawn from before a fork
    assert {s["env"] for s in seen} == {"1"}
    # Ray ran ``warm_exec`` as its setup worker, which stood in itself (no Ray setup_worker.py,
    # no shell, no second Python).
    client = Path(warm_start.__file__).with_name("warm_exec.py")
    for s in seen:
        command = [part.decode() for part in s["stand_in"]]  # type: ignore[attr-defined]
        assert command[1] == str(client)
        assert command[2].endswith("default_worker.py")
    ray.kill(probes[0])
    pid = int(seen[0]["pid"])  # type: ignore[call-overload]
    deadline = time.monotonic() + 30
    while "Z" not in status(pid):
        assert time.monotonic() < deadline, "a killed actor's process stayed"
        time.sleep(0.05)

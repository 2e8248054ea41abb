"""A Ray worker's start, warm: Ray's "setup worker" for an agent's own Ray, and the command Ray
runs instead of ``python`` for each of its worker processes (``warm_start``). Run by path, with
the standard library only: it must itself start in milliseconds.

Ray's raylet starts every Python worker as ``python setup_worker.py ...``, which imports Ray
(half a CPU-second) to apply the worker's runtime environment and exec the worker's Python.
The agent's Ray runs this file instead (``own_ray``): where the runtime environment asks for
nothing but its variables and this file as the worker's Python (the job's ``py_executable``),
it applies the variables as Ray's would and goes on in-process; for anything else it hands
over to Ray's own.

Then it asks the agent's fork server for a child already holding Ray, torch, transformers and
peft, hands it this process's standard streams, arguments, environment, directory and process
group, and stands in for it: Ray's raylet started this process and watches it, so it lives
exactly as long as the child, passes on the signals it gets, and exits as the child did. Where
no fork server answers (or it declines), it becomes the plain ``python`` Ray would have run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import sys
from typing import NoReturn

# The first argument when Ray runs this file as a worker's Python (the socket comes next).
STAND_IN = "--stand-in"
# Signals a worker's own process may get and its child must see (SIGKILL and SIGSTOP cannot be
# caught: the child leaves with this process, which it watches, and is in its process group).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def main() -> None:
    if sys.argv[1] == STAND_IN:
        stand_in(sys.argv[2], sys.argv[3:])
    else:
        setup_worker(sys.argv[1:])


def setup_worker(args: list[str]) -> None:
    """What Ray's ``setup_worker.py`` does for a worker whose Python is this file; Ray's own
    for any other."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", default="")
    parser.add_argument("--language", default="")
    known, worker = parser.parse_known_args(args)
    context = json.loads(known.serialized_runtime_env_context or "{}")
    python = shlex.split(context.get("py_executable") or "")
    if (
        known.language == "PYTHON"
        and not context.get("command_prefix")
        and not context.get("override_worker_entrypoint")
        and len(python) == 6
        and python[4] == STAND_IN
        and os.path.realpath(python[3]) == os.path.realpath(__file__)
        and worker
        and not worker[0].startswith("-")
    ):
        for key, value in (context.get("env_vars") or {}).items():
            # As Ray's ``update_envs``: ${VAR} expanded, an unset one to nothing.
            os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
        stand_in(python[5], worker)
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        raise SystemExit("Ray is not installed")
    rays = os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")
    os.execv(sys.executable, [sys.executable, rays, *args])


def stand_in(server: str, argv: list[str]) -> NoReturn:
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A server that does not answer in time (stuck, or still importing under heavy load)
        # gets this worker started cold, within Ray's minute for a worker to register.
        conn.settimeout(float(os.environ.get("SWARM_WARM_START_WAIT_S", "40")))
        conn.connect(server)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "pgid": os.getpgid(0)}
        data = json.dumps(request).encode()
        socket.send_fds(conn, [len(data).to_bytes(8, "big")], [0, 1, 2])
        conn.sendall(data)
        answer = read_exactly(conn, 9)
        conn.settimeout(None)
    except OSError:
        answer = b""
    if answer[:1] != b"P":  # no fork server, or it declined: start cold
        os.execv(sys.executable, [sys.executable, *argv])
    child = int.from_bytes(answer[1:], "big")
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _frame: _forward(child, sig))
    status = read_exactly(conn, 5)
    if status[:1] != b"X":
        # The fork server died first; the connection ends when the child does.
        os._exit(1)
    code = int.from_bytes(status[1:], "big", signed=True)
    if code < 0:  # the child was killed by a signal: so is its stand-in
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def _forward(child: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, sig)


def read_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer if the other end closed first."""
    data = b""
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    return data


if __name__ == "__main__":
    main()

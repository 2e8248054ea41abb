"""A fork server for the Ray worker processes of an agent's own Ray node.

Every process Ray starts for an attempt (its Ray Train controller, its ranks) is a new Python
that imports Ray, and a rank torch, transformers and peft too, before it does anything: about
5 CPU-seconds a rank, more than a short run's training, and seconds of a resumed job's wait on
any machine. This server imports them once, then forks each worker from itself: the child
starts with them imported, sharing their memory with its siblings.

How a worker gets here: the agent's Ray runs its workers' Python through ``warm_exec`` (the
``py_executable`` of the job's runtime environment), which sends this server its arguments,
environment, directory and standard streams; the child takes them over and runs Ray's
``default_worker.py`` as ``python`` would have. ``warm_exec`` stays in place for the child (Ray
watches the process it started) and exits as the child does.

What keeps a child the same as a cold start: nothing here touches CUDA (forking a process
that did breaks CUDA in the child; checked before every fork) or draws from Ray's generator of
IDs (``WARM_MODULES``), Ray's settings are read again from the worker's own environment, which
replaces the server's before Ray's code runs, and the child's random generators, path, process
group and signal handling start as a new process's would (``tests/trainer/test_warm_start.py``). The
server's socket is in a directory only the agent's user can open; it exits with the agent.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from swarm_trainer.warm_exec import read_exactly

# What every worker of an agent imports: Ray's worker, and a rank's torch, transformers, peft
# and model code. Not Ray Train: importing Ray Data (which it does) draws from the random
# generator of Ray's C++ side, which a fork would then give every worker in the same state, and
# Ray makes its IDs (placement groups among them) from it: two runs' groups would collide.
WARM_MODULES = (
    "ray._private.workers.default_worker",
    "torch",
    "transformers",
    "peft",
    "transformers.models.llama.modeling_llama",
    "swarm_trainer.model",
)
# Imported, any of these would have drawn from it (checked after the warm-up: then no fork).
DRAWS_IDS = ("ray.data", "ray.train")
# What Ray's C++ side reads from the environment once per process, when Ray is first imported
# (``ray_constants.RAY_INTERNAL_FLAGS``), and not again: the server imports Ray with the first
# worker's, and serves only workers that have the same (the job's and the raylet's).
INTERNAL_FLAGS = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")
# How often the server looks whether the agent that started it is still there.
PARENT_CHECK_S = 2.0
START_WAIT_S = 30.0


class WarmStart:
    """The fork server, as the agent starts and stops it."""

    def __init__(self, process: subprocess.Popen[bytes], directory: Path) -> None:
        self.process = process
        self.directory = directory

    @property
    def socket_path(self) -> Path:
        return self.directory / "warm.sock"

    def py_executable(self) -> str:
        """The command Ray runs instead of ``python`` for a worker."""
        client = self.setup_worker_path()
        return shlex.join([sys.executable, "-I", "-S", client, "--stand-in", str(self.socket_path)])

    def setup_worker_path(self) -> str:
        """What Ray runs instead of its ``setup_worker.py`` (``warm_exec``)."""
        return str(Path(__file__).with_name("warm_exec.py"))

    def stop(self) -> None:
        # The workers it forked stay: they go with their stand-ins, which Ray stops.
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start(modules: tuple[str, ...] = WARM_MODULES) -> WarmStart:
    """Start the fork server (it imports ``modules`` with its first worker) and wait for its
    socket."""
    directory = Path(tempfile.mkdtemp(prefix="swarm-warm-"))  # mode 0700
    process = subprocess.Popen(
        [sys.executable, "-m", "swarm_trainer.warm_start", str(directory / "warm.sock"), *modules],
        stdin=subprocess.DEVNULL,
    )
    server = WarmStart(process, directory)
    deadline = time.monotonic() + START_WAIT_S
    while not (directory / "ready").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("the fork server for Ray's workers did not start")
        time.sleep(0.01)
    return server


def serve(socket_path: str, modules: tuple[str, ...] = WARM_MODULES) -> None:
    _Server(socket_path, modules).run()


class _Server:
    def __init__(self, socket_path: str, modules: tuple[str, ...]) -> None:
        self.modules = modules
        # ``python -m`` put this process's directory first on its path (Ray inserts before it).
        self.own_path = sys.path[0]
        self.parent = os.getppid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_path)
        self.listener.listen(64)
        # SIGCHLD wakes the loop through this pipe, to reap the worker that ended.
        self.wake = os.pipe()
        for fd in self.wake:
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.children: dict[int, socket.socket] = {}  # each forked worker's stand-in
        self.flags: dict[str, str] | None = None  # set when warm
        Path(socket_path).with_name("ready").touch()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self.wake[0], selectors.EVENT_READ)
        while os.getppid() == self.parent:
            for key, _ in selector.select(PARENT_CHECK_S):
                if key.fileobj is self.listener:
                    self._serve(self.listener.accept()[0])
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake[0], 4096)
            self._reap()

    def _serve(self, conn: socket.socket) -> None:
        received = _receive(conn)
        if received is None:
            conn.close()
            return
        fds, request = received
        theirs = {f: request["env"][f] for f in INTERNAL_FLAGS if f in request["env"]}
        if self.flags is None:
            self.flags = _warm_up(theirs, self.modules)
        pid = 0
        if theirs == self.flags and not _cuda_initialized():
            pid = self._fork_worker(conn, fds, request)
        for fd in fds:
            os.close(fd)
        if pid:
            self.children[pid] = conn
        else:
            with contextlib.suppress(OSError):
                conn.sendall(b"D")  # declined: the stand-in starts a cold Python
            conn.close()

    def _fork_worker(self, conn: socket.socket, fds: list[int], request: dict[str, Any]) -> int:
        """Fork a worker for one request; its pid (0 if the stand-in is gone)."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self._become_worker(conn, fds, request)
            finally:
                os._exit(1)
        try:
            conn.sendall(b"P" + pid.to_bytes(8, "big"))
        except OSError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 0
        return pid

    def _become_worker(self, conn: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.listener.close()
        for other in self.children.values():
            other.close()
        for fd in self.wake:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        # Ray puts each worker in a process group of its own (a signal to the agent's group
        # does not reach it): the child joins its stand-in's.
        with contextlib.suppress(OSError):
            os.setpgid(0, request["pgid"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv: list[str] = request["argv"]
        sys.argv = argv
        # ``python script.py`` puts the script's directory where ``-m`` put the server's.
        sys.path[sys.path.index(self.own_path)] = os.path.dirname(os.path.abspath(argv[0]))
        _reseed()
        # Ray's C++ side read its settings from the server's environment when the imports
        # first asked for one: read again from the worker's.
        from ray._raylet import Config

        Config.initialize("")
        # The stand-in (``warm_exec``) is the process Ray watches: when it goes, so does this.
        threading.Thread(target=_exit_with, args=(conn,), daemon=True).start()
        code = 1
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()  # as python prints what ended a script
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    conn.sendall(b"X" + code.to_bytes(4, "big", signed=True))
                conn.close()


def _warm_up(flags: dict[str, str], modules: tuple[str, ...]) -> dict[str, str]:
    """Import what workers need, with the first worker's Ray flags in the environment."""
    os.environ.update(flags)
    for module in modules:
        importlib.import_module(module)
    from ray._private.ray_constants import RAY_INTERNAL_FLAGS

    if set(RAY_INTERNAL_FLAGS) != set(INTERNAL_FLAGS) or any(m in sys.modules for m in DRAWS_IDS):
        # A Ray that reads other flags once, or IDs that forked workers would share: serve none.
        return {"unknown": "not safe to fork"}
    return flags


def _receive(conn: socket.socket) -> tuple[list[int], dict[str, Any]] | None:
    """A stand-in's request: its standard streams, then its arguments, environment, directory."""
    fds: list[int] = []
    try:
        conn.settimeout(START_WAIT_S)
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        size = int.from_bytes(header, "big")
        body = read_exactly(conn, size)
        if len(body) < size:
            raise OSError("request cut short")
        conn.settimeout(None)
        if len(fds) != 3:
            raise OSError("no standard streams")
        return fds, json.loads(body)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return None


def _exit_with(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os._exit(1)


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def _reseed() -> None:
    # A forked child shares its parent's generators; a new process would have drawn NumPy's
    # from the OS. (Python's ``random`` reseeds itself at fork; torch's default generator
    # starts from a fixed seed in every process, which the server never drew from.)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]) or WARM_MODULES)

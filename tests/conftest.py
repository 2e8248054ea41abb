"""Session-wide real infrastructure: one nats-server with JetStream, unique names per test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from swarm_common.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port}")


class NatsServer:
    """A real nats-server with JetStream on a free port and a temp store dir."""

    def __init__(self, store_dir: Path) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
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

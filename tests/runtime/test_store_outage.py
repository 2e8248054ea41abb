"""An S3 store that goes away for a few seconds: calls made meanwhile wait it out.

The outage is a TCP proxy in front of the real S3 server that stops accepting (connection
refused) and drops its open connections, then comes back on the same port: what a store
restart or a network blip looks like to the client, with the server's data kept.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarm_runtime.settings import Settings
from swarm_runtime.store import NotFound, open_store
from swarm_runtime.store_outage import is_unreachable

from ..conftest import S3Server


class FlakyProxy:
    """Forwards 127.0.0.1:port to ``target``; ``outage(s)`` refuses and drops for ``s`` seconds."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._open()

    def _open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: the outage began
            upstream = socket.create_connection(self.target)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        assert self._listener is not None
        # shutdown first: a bare close leaves a listener that a thread blocks on accepting.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._conns.clear()

    def outage(self, seconds: float) -> None:
        self.close()
        time.sleep(seconds)
        self._open()


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[tuple[FlakyProxy, S3Server]]:
    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    flaky = FlakyProxy((host, int(port)))
    yield flaky, s3_server
    flaky.close()


def test_calls_during_a_short_outage_wait_for_the_store(
    proxy: tuple[FlakyProxy, S3Server],
) -> None:
    flaky, server = proxy
    store = open_store(
        Settings(
            store_url=f"s3://swarm-{uuid.uuid4().hex[:12]}?endpoint=http://127.0.0.1:{flaky.port}",
            s3_access_key=server.access_key,
            s3_secret_key=server.secret_key,
        )
    )
    store.put_bytes("inputs/data.jsonl", b'{"text": "kept"}\n')
    with ThreadPoolExecutor(3) as pool:
        down = pool.submit(flaky.outage, 10.0)  # as long as the chaos run's S3 outage
        time.sleep(0.5)  # well inside the outage
        read = pool.submit(store.get_bytes, "inputs/data.jsonl")
        write = pool.submit(store.put_bytes, "checkpoints/j/1/state.json", b"{}")
        down.result()
        assert read.result(timeout=60) == b'{"text": "kept"}\n'
        write.result(timeout=60)
    assert store.get_bytes("checkpoints/j/1/state.json") == b"{}"
    assert store.list("checkpoints/") == ["checkpoints/j/1/state.json"]


def test_an_unreachable_store_is_told_apart_from_its_answers(
    proxy: tuple[FlakyProxy, S3Server],
) -> None:
    import urllib3

    flaky, _ = proxy
    flaky.close()
    with pytest.raises(urllib3.exceptions.MaxRetryError) as refused:
        urllib3.PoolManager(retries=urllib3.Retry(0)).request(
            "GET", f"http://127.0.0.1:{flaky.port}/bucket/key"
        )
    wrapped = RuntimeError("could not fetch the dataset")
    wrapped.__cause__ = refused.value
    assert is_unreachable(wrapped)  # through the cause chain
    # From a Ray worker an error may arrive as its text only.
    assert is_unreachable(RuntimeError(f"TrainingFailedError: ... {refused.value}"))
    assert not is_unreachable(NotFound("datasets/x"))
    assert not is_unreachable(ValueError("lr must be finite"))

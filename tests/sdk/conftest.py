"""A real gateway (uvicorn in a thread) on the session's nats-server, for the CLI and SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarm_gateway import create_app
from swarm_runtime.settings import Settings

from ..conftest import ServerThread


@pytest.fixture
def gateway(settings: Settings) -> Iterator[ServerThread]:
    with ServerThread(create_app(settings, submit_wait_s=0.3, request_timeout_s=1.0)) as server:
        yield server

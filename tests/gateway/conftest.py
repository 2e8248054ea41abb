"""The real gateway app against the session's real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI

from swarm_gateway import create_app
from swarm_gateway.settings import GatewaySettings
from swarm_runtime.settings import Settings

from ..conftest import ServerThread


def make_app(settings: Settings) -> FastAPI:
    # Short waits: there is no scheduler or registry in these tests unless a test fakes one.
    return create_app(settings, submit_wait_s=0.3, request_timeout_s=1.0)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        yield c


@pytest.fixture
def auth_settings(settings: Settings) -> Settings:
    return GatewaySettings.of(settings, api_keys="ka=alice,kb=bob")


@pytest.fixture
async def auth_client(auth_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(auth_settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        yield c


@pytest.fixture
def live_gateway(settings: Settings) -> Iterator[ServerThread]:
    with ServerThread(make_app(settings)) as server:
        yield server


# Keys of the real-stack tests: alice's as given, bob's only as its hash, and an admin key.
ALICE, BOB, ADMIN = "key-alice", "key-bob", "key-admin"


@pytest.fixture
async def tenant_stack(settings: Settings) -> AsyncIterator[ServerThread]:
    """The real registry and scheduler in-process, and a live gateway with three API keys."""
    from swarm_gateway.auth import hash_key
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler

    keyed = GatewaySettings.of(
        settings, api_keys=f"{ALICE}=alice,{hash_key(BOB)}=bob", admin_keys=hash_key(ADMIN)
    )
    async with build_registry(keyed), build_scheduler(keyed):
        with ServerThread(create_app(keyed, submit_wait_s=5.0, request_timeout_s=5.0)) as gw:
            yield gw

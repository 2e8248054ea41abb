"""NATS away: every gateway handler that talks to it answers 503 with the reason, never a
500 or a hang, and serves again once NATS is back."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from swarm_gateway.state import Gateway
from swarm_runtime.settings import Settings

from ..conftest import NatsServer
from .conftest import make_app

# Path parameters that pass validation, so that a request reaches its handler.
PARAMS = {
    "job_id": "job-0123456789abcdef0123",
    "sweep_id": "sweep-0123456789abcdef",
    "dataset_id": "ds-0123456789abcdef01234567",
    "name": "bot",
    "version": "1",
    "alias": "prod",
    "worker_id": "w1",
    "model_id": "tiny",
    "file_id": "file-0123456789abcdef01234567",
    "fine_tuning_job_id": "ftjob-0123456789abcdef0123",
    "sampler_id": "tsess-0123456789abcdef:sample:0",
    "upload_id": "dsu-0123456789abcdef01234567",
    "session_id": "tsess-0123456789abcdef",
}
# Answered without NATS by design.
NO_NATS = {
    "/healthz",
    "/",
    "/dashboard",
    # The Tinker SDK's start-up: its health check, static client settings and its telemetry.
    "/api/v1/healthz",
    "/api/v1/client/config",
    "/api/v1/client/dynamic_config",
    "/api/v1/telemetry",
}


def operations(app: object) -> list[tuple[str, str]]:
    spec = app.openapi()  # type: ignore[attr-defined]
    found = []
    for path, item in spec["paths"].items():
        if path in NO_NATS or path.startswith("/dashboard"):
            continue
        for method in item:
            found.append((method.upper(), re.sub(r"{(\w+)}", lambda m: PARAMS[m[1]], path)))
    return found


@pytest.fixture
async def outage(
    tmp_path: Path, namespace: str
) -> AsyncIterator[tuple[httpx.AsyncClient, NatsServer, Gateway]]:
    server = NatsServer(tmp_path / "nats")
    settings = Settings(
        nats_url=server.url, namespace=namespace, store_url=(tmp_path / "store").as_uri()
    )
    app = make_app(settings)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
        ):
            yield c, server, app.state.gateway
    finally:
        server.stop()


async def wait_until(check: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_every_nats_handler_is_a_503_with_the_reason_while_nats_is_away(
    outage: tuple[httpx.AsyncClient, NatsServer, Gateway],
) -> None:
    client, server, gw = outage
    assert (await client.get("/v1/jobs")).status_code == 200
    server.stop()
    await wait_until(lambda: not gw.nc.is_connected)

    ops = operations(client._transport.app)  # type: ignore[attr-defined]
    assert len(ops) > 20
    wrong = []
    for method, path in ops:
        resp = await client.request(method, path)
        body = resp.json()
        text = body["error"]["message"] if "error" in body else body.get("detail")
        if resp.status_code != 503 or "not connected to NATS" not in str(text):
            wrong.append((method, path, resp.status_code, resp.text[:200]))
    assert not wrong

    health = await client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["nats"] is False

    server.start()
    await wait_until(lambda: gw.nc.is_connected, 15)
    assert (await client.get("/v1/jobs")).status_code == 200


async def test_a_stray_answer_to_a_command_is_a_503_not_a_500(
    outage: tuple[httpx.AsyncClient, NatsServer, Gateway],
) -> None:
    """A core-NATS subscriber that answers a JetStream command's ack inbox (the trainer's
    cancel handler once did, with an empty body) is no ack: 503 naming the subject."""
    import nats
    from nats.aio.msg import Msg

    from swarm_contracts.jobs import JobRecord, JobSpec

    client, server, gw = outage
    job_id = PARAMS["job_id"]
    spec = JobSpec(name="bot", base_model="tiny", dataset="ds-0123456789abcdef")
    await gw.jobs.create(job_id, JobRecord(job_id=job_id, tenant="default", spec=spec))
    # Without the stream, the stray subscriber is the only one who answers.
    await gw.js.delete_stream(gw.subjects.control_stream)
    nc = await nats.connect(server.url)

    async def stray(msg: Msg) -> None:
        await msg.respond(b"")

    try:
        await nc.subscribe(gw.subjects.cancel(job_id), cb=stray)
        await nc.flush()
        resp = await client.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        await nc.close()
    assert resp.status_code == 503, resp.text
    assert f"publishing to {gw.subjects.cancel(job_id)} failed" in resp.json()["detail"]


async def test_a_kv_timeout_mid_request_is_a_503(
    outage: tuple[httpx.AsyncClient, NatsServer, Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    import nats.errors

    client, _, gw = outage

    async def slow(*_: object) -> None:
        raise nats.errors.TimeoutError

    monkeypatch.setattr(gw.jobs, "get", slow)
    resp = await client.get(f"/v1/jobs/{PARAMS['job_id']}")
    assert resp.status_code == 503, resp.text
    assert "NATS unavailable" in resp.json()["detail"]

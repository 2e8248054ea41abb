"""API keys map to tenants; tenants never see each other's data."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from swarm_gateway.settings import GatewaySettings
from swarm_runtime.settings import Settings

from .conftest import make_app

A = {"Authorization": "Bearer ka"}
B = {"Authorization": "Bearer kb"}
DATA = "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(3)).encode()


async def test_missing_and_unknown_keys_are_401(auth_client: httpx.AsyncClient) -> None:
    assert (await auth_client.get("/v1/datasets")).status_code == 401
    bad = await auth_client.get("/v1/datasets", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert "unknown API key" in bad.text
    assert (await auth_client.get("/healthz")).status_code == 200


async def test_datasets_are_per_tenant(auth_client: httpx.AsyncClient) -> None:
    up = await auth_client.post("/v1/datasets", files={"file": ("d.jsonl", DATA)}, headers=A)
    assert up.status_code == 201
    assert up.json()["tenant"] == "alice"
    ds = up.json()["id"]
    assert [d["id"] for d in (await auth_client.get("/v1/datasets", headers=A)).json()["data"]] == [
        ds
    ]
    assert (await auth_client.get("/v1/datasets", headers=B)).json()["data"] == []
    assert (await auth_client.get(f"/v1/datasets/{ds}", headers=B)).status_code == 404

    # Bob cannot train on Alice's dataset even knowing its id.
    spec = {"name": "bot", "base_model": "tiny-llama", "dataset": ds}
    resp = await auth_client.post("/v1/jobs", json=spec, headers=B)
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "dataset"]

    # Bob uploading the same bytes gets his own record under his own store key.
    mine = await auth_client.post("/v1/datasets", files={"file": ("d.jsonl", DATA)}, headers=B)
    assert mine.status_code == 201
    assert mine.json()["store_key"].startswith("datasets/bob/")


async def test_auth_off_is_said_loudly_at_start_up(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from swarm_gateway.app import AUTH_OFF_WARNING

    for keys, warned in (("", True), ("k=alice", False)):
        caplog.clear()
        app = make_app(GatewaySettings.of(settings, api_keys=keys))
        with caplog.at_level(logging.WARNING, logger="swarm_gateway.app"):
            async with app.router.lifespan_context(app):
                pass
        assert (AUTH_OFF_WARNING in caplog.text) is warned

"""``/v1/adapters`` against the real registry app: tenant scope, aliases, lineage, deletion,
and downloads that verify every byte before sending any."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import AsyncIterator
from typing import Any

import httpx
import nats
import pytest

from swarm_contracts.subjects import Subjects
from swarm_gateway import create_app
from swarm_gateway.settings import GatewaySettings
from swarm_registry import build_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, open_store

from ..registry.conftest import safetensors_bytes
from ..registry.test_adapters import lineage, upload_output

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer kadmin"}


class Files:
    def safetensors(self, shapes: dict[str, list[int]]) -> bytes:
        return safetensors_bytes(shapes)


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    registry = build_app(settings)
    await registry.start()
    app = create_app(GatewaySettings.of(settings, api_keys="ka=alice,kb=bob", admin_keys="kadmin"))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        yield c
    await registry.stop()


async def add(settings: Settings, job: str, tenant: str = "alice", **kw: Any) -> None:
    """Register through the registry's own NATS API, as the trainer does."""
    store = open_store(settings)
    key = upload_output(store, job, Files())
    nc = await nats.connect(settings.nats_url)
    body = {"name": "bot", "store_key": key, "lineage": lineage(job, tenant=tenant, **kw)}
    msg = await nc.request(
        Subjects(settings.namespace).registry("adapters.register"),
        json.dumps(body).encode(),
        timeout=10,
    )
    await nc.close()
    assert json.loads(msg.data)["ok"], msg.data


async def test_tenant_scope_aliases_lineage_and_delete(
    gateway: httpx.AsyncClient, settings: Settings
) -> None:
    await add(settings, "job-1")
    await add(settings, "job-2", parent="bot@1", base_model="big")
    await add(settings, "job-3", tenant="bob")

    listed = await gateway.get("/v1/adapters", headers=ALICE)
    assert [a["version"] for a in listed.json()["data"]] == [1, 2]
    by_model = await gateway.get("/v1/adapters?base_model=big", headers=ALICE)
    assert [a["version"] for a in by_model.json()["data"]] == [2]
    assert (await gateway.get("/v1/adapters/bot", headers=ALICE)).json()["version"] == 2
    # Version numbers are per tenant: bob's first "bot" is v1, whatever alice has.
    bobs = (await gateway.get("/v1/adapters/bot", headers=BOB)).json()
    assert (bobs["version"], bobs["tenant"]) == (1, "bob")
    for path in ("/v1/adapters/bot/versions/2", "/v1/adapters/bot/versions/2/lineage"):
        assert (await gateway.get(path, headers=BOB)).status_code == 404

    put = await gateway.put(
        "/v1/adapters/bot/aliases/production", json={"version": 1}, headers=ALICE
    )
    assert put.status_code == 200, put.text
    assert put.json()["tenant"] == "alice"
    assert put.json()["version"] == 1
    alias = await gateway.get("/v1/adapters/bot/aliases/production", headers=ALICE)
    assert alias.json()["version"] == 1
    assert (
        await gateway.get("/v1/adapters/bot/aliases/production", headers=BOB)
    ).status_code == 404
    hijack = await gateway.put(
        "/v1/adapters/bot/aliases/production", json={"version": 2}, headers=BOB
    )
    assert hijack.status_code == 404
    own = await gateway.put("/v1/adapters/bot/aliases/production", json={"version": 1}, headers=BOB)
    assert own.json()["tenant"] == "bob"
    alias = await gateway.get("/v1/adapters/bot/aliases/production", headers=ALICE)
    assert (alias.json()["tenant"], alias.json()["version"]) == ("alice", 1)
    bad = await gateway.put("/v1/adapters/bot/aliases/production", json={"v": 1}, headers=ALICE)
    assert bad.status_code == 422

    graph = (await gateway.get("/v1/adapters/bot/versions/2/lineage", headers=ALICE)).json()
    assert [n["ref"] for n in graph["adapters"]] == ["bot@2", "bot@1"]

    held = await gateway.delete("/v1/adapters/bot/versions/1", headers=ALICE)
    assert held.status_code == 409
    assert "production" in held.json()["detail"]
    assert (await gateway.delete("/v1/adapters/bot/versions/3", headers=ALICE)).status_code == 404
    gone = await gateway.delete("/v1/adapters/bot/versions/2", headers=ALICE)
    assert gone.status_code == 200
    assert gone.json()["version"] == 2
    assert (await gateway.get("/v1/adapters/bot/versions/2", headers=ALICE)).status_code == 404

    rule = await gateway.put(
        "/v1/adapters/bot/rules/candidate", json={"metric": "eval_loss"}, headers=ALICE
    )
    assert rule.status_code == 200
    assert rule.json()["tenant"] == "alice"
    await add(settings, "job-4", metrics={"eval_loss": 0.5})
    candidate = await gateway.get("/v1/adapters/bot/aliases/candidate", headers=ALICE)
    assert candidate.json()["version"] == 3  # alice's third: bob's bot took no number of hers


async def test_download_verifies_and_never_serves_a_corrupted_file(
    gateway: httpx.AsyncClient, settings: Settings
) -> None:
    await add(settings, "job-1")
    store: ObjectStore = open_store(settings)
    resp = await gateway.get("/v1/adapters/bot/versions/1/download", headers=ALICE)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
        names = sorted(tar.getnames())
        served = {n: tar.extractfile(n).read() for n in names}  # type: ignore[union-attr]
    assert names == ["adapter_config.json", "adapter_model.safetensors"]
    for name, data in served.items():
        assert data == store.get_bytes(f"adapters/alice/bot/1/{name}")
    assert (
        await gateway.get("/v1/adapters/bot/versions/1/download", headers=BOB)
    ).status_code == 404

    weights = "adapters/alice/bot/1/adapter_model.safetensors"
    data = bytearray(store.get_bytes(weights))
    data[-1] ^= 0x01
    store.put_bytes(weights, bytes(data))
    bad = await gateway.get("/v1/adapters/bot/versions/1/download", headers=ALICE)
    assert bad.status_code == 502
    assert "adapter_model.safetensors" in bad.json()["detail"]
    assert "corrupted" in bad.json()["detail"]
    assert bytes(data) not in bad.content


async def test_a_quarantined_version_is_shown_and_an_admin_releases_it(
    gateway: httpx.AsyncClient, settings: Settings
) -> None:
    await add(settings, "job-g1")
    await add(settings, "job-g2")
    nc = await nats.connect(settings.nats_url)
    reply = await nc.request(
        Subjects(settings.namespace).registry("adapters.quarantine"),
        json.dumps({"job_id": "job-g2", "reason": "replay 0.9 away"}).encode(),
        timeout=10,
    )
    await nc.close()
    assert json.loads(reply.data)["ok"], reply.data

    latest = await gateway.get("/v1/adapters/bot", headers=ALICE)
    assert latest.json()["version"] == 1
    shown = await gateway.get("/v1/adapters/bot/versions/2", headers=ALICE)
    assert shown.json()["quarantine"]["reason"] == "replay 0.9 away"
    listed = (await gateway.get("/v1/adapters", headers=ALICE)).json()["data"]
    assert [a["quarantine"] is not None for a in listed] == [False, True]
    alias = await gateway.put("/v1/adapters/bot/aliases/prod", json={"version": 2}, headers=ALICE)
    assert alias.status_code == 409, alias.text
    assert "quarantined" in alias.json()["detail"]

    path = "/v1/adapters/bot/versions/2/unquarantine?tenant=alice"
    assert (await gateway.post(path, headers=ALICE)).status_code == 403
    released = await gateway.post(path, headers=ADMIN)
    assert released.status_code == 200, released.text
    assert released.json()["quarantine"] is None
    assert (await gateway.get("/v1/adapters/bot", headers=ALICE)).json()["version"] == 2


async def test_a_quarantined_version_is_not_downloaded(
    gateway: httpx.AsyncClient, settings: Settings
) -> None:
    await add(settings, "job-d1")
    nc = await nats.connect(settings.nats_url)
    await nc.request(
        Subjects(settings.namespace).registry("adapters.quarantine"),
        json.dumps({"job_id": "job-d1", "reason": "replay 0.9 away"}).encode(),
        timeout=10,
    )
    await nc.close()
    refused = await gateway.get("/v1/adapters/bot/versions/1/download", headers=ALICE)
    assert refused.status_code == 409, refused.text
    assert "quarantined" in refused.json()["detail"]

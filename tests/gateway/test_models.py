"""Model uploads: safetensors only, flat names, registry request/reply, 503 when it is down."""

from __future__ import annotations

import json

import httpx
import nats
import pytest

from swarm_contracts.registry import ModelVersion, RegisterModel, Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store

CONFIG = ("config.json", b'{"model_type": "llama"}')
WEIGHTS = ("model.safetensors", b"\x00" * 16)


def files(*items: tuple[str, bytes]) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", item) for item in items]


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ((CONFIG, ("pytorch_model.bin", b"x")), "pickle"),
        ((CONFIG, WEIGHTS, ("model.pt", b"x")), "pickle"),
        ((WEIGHTS,), "config.json"),
        ((CONFIG,), ".safetensors"),
        ((CONFIG, WEIGHTS, ("..evil", b"x")), "flat name"),
    ],
)
async def test_bad_model_uploads(
    client: httpx.AsyncClient, items: tuple[tuple[str, bytes], ...], needle: str
) -> None:
    resp = await client.post("/v1/models", data={"name": "tiny"}, files=files(*items))
    assert resp.status_code == 422, resp.text
    assert needle in resp.text


async def test_bad_model_name(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/models", data={"name": "Bad.Name"}, files=files(CONFIG, WEIGHTS))
    assert resp.status_code == 422
    assert "name" in json.dumps(resp.json()["detail"][0]["loc"])


async def test_registry_down_is_503(client: httpx.AsyncClient) -> None:
    for path in ("/v1/models", "/v1/models/tiny", "/v1/adapters", "/v1/adapters/bot"):
        resp = await client.get(path)
        assert resp.status_code == 503, (path, resp.text)
        body = resp.json()
        # The model reads are OpenAI's too (models.list, models.retrieve): OpenAI's shape.
        detail = body["error"]["message"] if path.startswith("/v1/models") else body["detail"]
        assert "registry" in detail
    resp = await client.post("/v1/models", data={"name": "tiny"}, files=files(CONFIG, WEIGHTS))
    assert resp.status_code == 503


async def test_upload_and_register(client: httpx.AsyncClient, settings: Settings) -> None:
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    seen: list[RegisterModel] = []

    async def fake_registry(msg: nats.aio.msg.Msg) -> None:
        req = RegisterModel.model_validate_json(msg.data)
        seen.append(req)
        store = open_store(settings)
        version = ModelVersion(
            name=req.name,
            version=1,
            store_key=req.store_key,
            files=store.file_digests(req.store_key),
            digest="d",
            architecture="LlamaForCausalLM",
            parameter_count=1,
            tokenizer=False,
        )
        await msg.respond(Reply[ModelVersion](ok=True, result=version).model_dump_json().encode())

    await nc.subscribe(subjects.registry("models.register"), cb=fake_registry)
    try:
        resp = await client.post("/v1/models", data={"name": "tiny"}, files=files(CONFIG, WEIGHTS))
        assert resp.status_code == 201, resp.text
        body = resp.json()
        assert body["version"] == 1
        assert body["store_key"].startswith("models/tiny/")
        assert len(body["store_key"]) == 12 + 16
        assert set(body["files"]) == {"config.json", "model.safetensors"}
        assert seen[0].store_key == body["store_key"]
    finally:
        await nc.close()

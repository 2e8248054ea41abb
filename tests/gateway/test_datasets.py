"""Dataset uploads: validation naming the bad line, content addressing, size limit (compressed
uploads: tests/gateway/test_dataset_compression.py)."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
import zstandard

from swarm_gateway import create_app
from swarm_gateway.settings import GatewaySettings
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


PC = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(5)]


PAIRS = [{"prompt": f"{i} + 1 =", "chosen": f" {i + 1}", "rejected": f" {i}"} for i in range(3)]
CHAT_PAIR = {
    "prompt": [{"role": "user", "content": "2 + 2?"}],
    "chosen": [{"role": "assistant", "content": "4"}],
    "rejected": [{"role": "assistant", "content": "5"}],
}
OPENAI_PAIR = {
    "input": {"messages": [{"role": "user", "content": "2 + 2?"}]},
    "preferred_output": [{"role": "assistant", "content": "4"}],
    "non_preferred_output": [{"role": "assistant", "content": "5"}],
}


async def upload(client: httpx.AsyncClient, data: bytes, name: str | None = None) -> httpx.Response:
    form = {"name": name} if name else None
    return await client.post("/v1/datasets", files={"file": ("d.jsonl", data)}, data=form)


async def test_upload_is_content_addressed(client: httpx.AsyncClient, settings: Settings) -> None:
    first = await upload(client, jsonl(PC), name="adds")
    assert first.status_code == 201, first.text
    info = first.json()
    assert info["id"].startswith("ds-")
    assert info["format"] == "prompt_completion"
    assert info["examples"] == 5
    assert info["name"] == "adds"
    assert info["store_key"] == f"datasets/default/{info['sha256']}.jsonl.zst"
    assert info["sha256"] == hashlib.sha256(jsonl(PC)).hexdigest()
    assert info["bytes"] == len(jsonl(PC))
    stored = open_store(settings).get_bytes(info["store_key"])
    assert zstandard.ZstdDecompressor().decompressobj().decompress(stored) == jsonl(PC)

    again = await upload(client, jsonl(PC))
    assert again.status_code == 200
    assert again.json()["id"] == info["id"]

    listed = (await client.get("/v1/datasets")).json()["data"]
    assert [d["id"] for d in listed] == [info["id"]]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (jsonl(PC[:2]) + b"{not json}\n", "line 3"),
        (jsonl(PC[:1]) + b"\xff\xfe\n" + jsonl(PC[:1]), "line 2"),
        (jsonl(PC[:2]) + jsonl([{"text": "hello"}]), "line 3"),
        (jsonl([{"messages": [{"role": "user"}]}, *PC]), "line 1"),
        (jsonl([*PC[:3], {"prompt": 1, "completion": "x"}]), "line 4"),
        (b"[1, 2]\n", "line 1"),
        (jsonl(PC[:1]), "at least 2 examples"),
        (
            jsonl([PAIRS[0], {"prompt": "q", "chosen": "a"}]),
            "line 2: a preference pair needs 'rejected'",
        ),
        (jsonl([PAIRS[0], {**PAIRS[0], "chosen": 3}]), "line 2: 'chosen' must be a string"),
        (jsonl([*PAIRS, *PC]), "line 4: format prompt_completion differs"),
        (
            jsonl([CHAT_PAIR, {**CHAT_PAIR, "rejected": [{"role": "user", "content": "n"}]}]),
            "line 2: 'rejected' must end with an assistant message",
        ),
        (jsonl([OPENAI_PAIR, {**OPENAI_PAIR, "input": {}}]), "line 2: 'input.messages' must be"),
    ],
)
async def test_bad_datasets_name_the_line(
    client: httpx.AsyncClient, data: bytes, needle: str
) -> None:
    resp = await upload(client, data)
    assert resp.status_code == 422, resp.text
    assert needle in resp.text
    assert resp.json()["detail"][0]["loc"][:2] == ["body", "file"]


async def test_all_formats_accepted(client: httpx.AsyncClient) -> None:
    text = jsonl([{"text": "a"}, {"text": "b"}])
    chat = jsonl(
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
        * 2
    )
    assert (await upload(client, text)).json()["format"] == "text"
    assert (await upload(client, chat)).json()["format"] == "chat"
    # DPO's preference pairs, in each of their forms.
    assert (await upload(client, jsonl(PAIRS))).json()["format"] == "preference"
    assert (await upload(client, jsonl([CHAT_PAIR] * 2))).json()["format"] == "preference_chat"
    openai = (await upload(client, jsonl([OPENAI_PAIR] * 2))).json()
    assert openai["format"] == "preference_openai"


async def test_upload_size_limit(settings: Settings) -> None:
    app = create_app(GatewaySettings.of(settings, max_upload_bytes=100))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        resp = await upload(c, jsonl(PC * 10))
        assert resp.status_code == 413
        assert "limit" in resp.text

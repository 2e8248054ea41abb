"""Names are labels, not paths: every user-supplied name is checked by the contracts' one
rule (``swarm_contracts.names``), and a bad one is a 4xx naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

PC = "".join(json.dumps({"prompt": f"{i}", "completion": f" {i}"}) + "\n" for i in range(3))


def multipart(fields: list[tuple[bytes, bytes | None, bytes]]) -> tuple[bytes, str]:
    """A multipart body built by hand, so that names can hold bytes that are not UTF-8."""
    boundary = b"swarm-test-boundary"
    out = b""
    for name, filename, content in fields:
        disposition = b'form-data; name="' + name + b'"'
        if filename is not None:
            disposition += b'; filename="' + filename + b'"'
        out += b"--" + boundary + b"\r\nContent-Disposition: " + disposition + b"\r\n\r\n"
        out += content + b"\r\n"
    out += b"--" + boundary + b"--\r\n"
    return out, f"multipart/form-data; boundary={boundary.decode()}"


async def post_dataset(
    client: httpx.AsyncClient, filename: bytes, name: bytes | None = None
) -> httpx.Response:
    fields = [(b"file", filename, PC.encode())]
    if name is not None:
        fields.append((b"name", None, name))
    body, content_type = multipart(fields)
    return await client.post("/v1/datasets", content=body, headers={"content-type": content_type})


def locs(resp: httpx.Response) -> list[list[str | int]]:
    return [e["loc"] for e in resp.json()["detail"]]


async def test_a_dataset_file_name_is_kept_as_its_base_name(client: httpx.AsyncClient) -> None:
    resp = await post_dataset(client, b"../../../../tmp/x.jsonl")
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "x.jsonl"


async def test_a_label_that_is_not_utf8_is_only_text(client: httpx.AsyncClient) -> None:
    # Printable once read as Latin-1 (Starlette's fallback): kept as that text, never a path.
    resp = await post_dataset(client, b"d.jsonl", b"caf\xe9 \xff")
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "café ÿ"


@pytest.mark.parametrize(
    "name",
    [
        b"../../etc/passwd",
        b"a\x00b",
        b"line\nbreak",
        b"\x1b[31mred",
        b"x" * 201,
        # Not UTF-8: the HTTP layer (Starlette) reads such a form field as Latin-1, so these
        # bytes arrive as C1 control characters, which no label may hold.
        b"\x85\x9b31m not utf-8",
    ],
)
async def test_a_bad_dataset_name_is_a_422_naming_it(
    client: httpx.AsyncClient, name: bytes
) -> None:
    resp = await post_dataset(client, b"d.jsonl", name)
    assert resp.status_code == 422, resp.text
    assert locs(resp) == [["body", "name"]]


@pytest.mark.parametrize("filename", [b"..", b"bad\x07bell.jsonl", b"\x9b.jsonl"])
async def test_a_bad_file_name_is_a_422_naming_the_file(
    client: httpx.AsyncClient, filename: bytes
) -> None:
    resp = await post_dataset(client, filename)
    assert resp.status_code == 422, resp.text
    assert locs(resp) == [["body", "file"]]


BAD_PATH_NAMES = ["..%2F..%2Fetc", "a%00b", "a%0Ab", "%FF%FE", "Upper", "x" * 64, "a.b"]


@pytest.mark.parametrize("name", BAD_PATH_NAMES)
async def test_a_bad_adapter_name_is_a_422_naming_it(client: httpx.AsyncClient, name: str) -> None:
    resp = await client.get(f"/v1/adapters/{name}/versions/1")
    # A name with an encoded '/' may not even route: then it is a 404, never a lookup.
    assert resp.status_code in (404, 422), resp.text
    if resp.status_code == 422:
        assert locs(resp) == [["path", "name"]]


@pytest.mark.parametrize("alias", ["a%00b", "%FF", "a.b", "x" * 64])
async def test_a_bad_alias_is_a_422_naming_it(client: httpx.AsyncClient, alias: str) -> None:
    for method in ("GET", "PUT"):
        resp = await client.request(
            method, f"/v1/adapters/bot/aliases/{alias}", json={"version": 1}
        )
        assert resp.status_code == 422, resp.text
        assert ["path", "alias"] in locs(resp)


async def test_a_bad_rule_is_a_422_naming_the_field(client: httpx.AsyncClient) -> None:
    resp = await client.put("/v1/adapters/bot/rules/a%0Ab", json={"metric": "eval_loss"})
    assert resp.status_code == 422
    assert locs(resp) == [["path", "alias"]]
    resp = await client.put("/v1/adapters/bot/rules/prod", json={"metric": "../x\n"})
    assert resp.status_code == 422
    assert locs(resp) == [["body", "metric"]]


@pytest.mark.parametrize("name", [b"../m", b"m\x00", b"\xff", b"M" * 10, b"m" * 64])
async def test_a_bad_model_name_is_a_422_naming_it(client: httpx.AsyncClient, name: bytes) -> None:
    body, content_type = multipart([(b"name", None, name), (b"files", b"config.json", b"{}")])
    resp = await client.post("/v1/models", content=body, headers={"content-type": content_type})
    assert resp.status_code == 422, resp.text
    assert locs(resp) == [["body", "name"]]

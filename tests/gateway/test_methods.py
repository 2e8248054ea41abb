"""OPTIONS and 405 name every method of the path in ``Allow`` (RFC 9110)."""

from __future__ import annotations

import httpx

from swarm_gateway.methods import route_operations
from swarm_runtime.settings import Settings

from .conftest import make_app


async def test_options_lists_every_method_of_the_path(client: httpx.AsyncClient) -> None:
    resp = await client.options("/v1/jobs")
    assert resp.status_code == 204
    assert set(resp.headers["allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
    one = await client.options("/v1/adapters/bot/aliases/prod")
    assert set(one.headers["allow"].split(", ")) == {"GET", "HEAD", "PUT", "OPTIONS"}


async def test_an_unsupported_method_is_a_405_with_allow(client: httpx.AsyncClient) -> None:
    resp = await client.delete("/v1/jobs")
    assert resp.status_code == 405
    assert set(resp.headers["allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
    assert resp.json() == {"detail": "Method Not Allowed"}


async def test_an_unknown_path_is_still_a_404(client: httpx.AsyncClient) -> None:
    assert (await client.options("/v1/nothing-here")).status_code == 404


async def test_an_unparsable_body_is_a_422_naming_the_body(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/jobs", content=b"\x18\xff\xfe", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body"]


def test_the_method_table_lists_exactly_the_openapi_document_s_operations(
    settings: Settings,
) -> None:
    """Read from the routes (making the document costs a tenth of a second per app), it must
    still be what the document says."""
    app = make_app(settings)
    from_routes: dict[str, set[str]] = {}
    for path, methods in route_operations(app.routes):
        from_routes.setdefault(path, set()).update(methods)
    verbs = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    from_document = {
        path: {m.upper() for m in item if m in verbs}
        for path, item in app.openapi()["paths"].items()
    }
    assert from_routes == from_document

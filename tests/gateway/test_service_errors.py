"""The services' refusal codes become HTTP statuses in one place; an outage is a 503."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from swarm_contracts.registry import AdapterVersion
from swarm_contracts.replies import ErrorCode, Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings


@pytest.fixture
async def refusing_registry(settings: Settings) -> AsyncIterator[list[ErrorCode]]:
    """Answers every adapters.get with a refusal coded as the last code in the list."""
    codes: list[ErrorCode] = []
    nc = await nats.connect(settings.nats_url)

    async def refuse(msg: Msg) -> None:
        reply = Reply[AdapterVersion](ok=False, error=f"refused as {codes[-1]}", code=codes[-1])
        await msg.respond(reply.model_dump_json().encode())

    await nc.subscribe(Subjects(settings.namespace).registry("adapters.get"), cb=refuse)
    yield codes
    await nc.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("not_found", 404),
        ("conflict", 409),
        ("invalid", 422),
        ("forbidden", 403),
        ("internal", 502),
    ],
)
async def test_each_refusal_code_has_its_status(
    client: httpx.AsyncClient, refusing_registry: list[ErrorCode], code: ErrorCode, status: int
) -> None:
    refusing_registry.append(code)
    resp = await client.get("/v1/adapters/bot")
    assert resp.status_code == status, resp.text
    assert resp.json() == {"detail": f"refused as {code}"}


async def test_no_registry_is_a_503_with_the_reason(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/adapters/bot/versions/1/lineage")
    assert resp.status_code == 503
    assert "registry" in resp.json()["detail"]
    assert "no responders" in resp.json()["detail"]


SPEC = '{"name": "bot", "base_model": "tiny", "dataset": "ds-0123456789abcdef", '


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (SPEC + '"training": {"lr": NaN}}', ["body", "training", "lr"]),
        (SPEC + '"training": {"max_grad_norm": Infinity}}', ["body", "training", "max_grad_norm"]),
        (SPEC + '"lora": {"alpha": -Infinity}}', ["body", "lora", "alpha"]),
    ],
)
async def test_a_non_finite_number_is_a_422_not_a_500(
    client: httpx.AsyncClient, body: str, loc: list[str]
) -> None:
    resp = await client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == loc
    assert error["input"] in ("NaN", "inf", "-inf", "nan")


async def test_a_non_finite_number_on_the_openai_routes_is_a_400(
    client: httpx.AsyncClient,
) -> None:
    body = '{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
    resp = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "temperature"


def test_a_record_holding_nan_still_renders() -> None:
    from swarm_gateway.responses import FiniteJSONResponse

    resp = FiniteJSONResponse({"metrics": {"loss": float("nan"), "ok": 1.5}, "x": [float("inf")]})
    assert json.loads(resp.body) == {"metrics": {"loss": None, "ok": 1.5}, "x": [None]}

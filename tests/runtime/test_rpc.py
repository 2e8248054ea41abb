"""The request/reply helper against a real nats-server: results, coded refusals, outages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import BaseModel

from swarm_contracts.replies import Action, Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable, answer
from swarm_runtime.settings import Settings


class Echo(BaseModel):
    text: str


class Shout(BaseModel):
    text: str
    length: int


SHOUT = Action("echo.shout", Echo, Shout)
SILENT = Action("echo.silent", Echo, Shout)
GARBLED = Action("echo.garbled", Echo, Shout)
NOBODY = Action("nobody.home", Echo, Shout)


async def shout(request: Echo) -> Shout:
    if request.text == "missing":
        raise Refused("no such text", "not_found")
    if request.text == "taken":
        raise Refused("text is held by another caller", "conflict")
    if request.text == "boom":
        raise ZeroDivisionError("boom")
    return Shout(text=request.text.upper(), length=len(request.text))


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    yield client
    await client.close()


@pytest.fixture
async def client(nc: Client, settings: Settings) -> AsyncIterator[ServiceClient]:
    subjects = Subjects(settings.namespace)

    async def handler(msg: Msg) -> None:
        if msg.subject.endswith(".silent"):
            return  # a service that takes the request and never answers
        if msg.subject.endswith(".garbled"):
            await msg.respond(b'{"ok": "perhaps"}')
            return
        reply = await answer(SHOUT.reply, shout(Echo.model_validate_json(msg.data)))
        await msg.respond(reply.model_dump_json().encode())

    sub = await nc.subscribe(subjects.registry("echo.*"), cb=handler)
    yield ServiceClient(nc, "registry", subjects.registry, timeout=0.5)
    if not nc.is_closed:
        await sub.unsubscribe()


async def test_a_result_comes_back_typed(client: ServiceClient) -> None:
    result = await client.call(SHOUT, Echo(text="hi"))
    assert result == Shout(text="HI", length=2)
    reply = await client.ask(SHOUT, Echo(text="hi"))
    assert reply.ok
    assert reply.code is None


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [("missing", "not_found", "no such text"), ("taken", "conflict", "held by another")],
)
async def test_a_refusal_keeps_its_code_and_message(
    client: ServiceClient, text: str, code: str, words: str
) -> None:
    reply = await client.ask(SHOUT, Echo(text=text))
    assert not reply.ok
    assert reply.code == code
    with pytest.raises(Refused) as refused:
        await client.call(SHOUT, Echo(text=text))
    assert refused.value.code == code
    assert words in refused.value.message


async def test_a_handler_crash_is_an_internal_refusal_not_a_timeout(client: ServiceClient) -> None:
    with pytest.raises(Refused) as refused:
        await client.call(SHOUT, Echo(text="boom"))
    assert refused.value.code == "internal"
    assert "ZeroDivisionError" in refused.value.message


async def test_nobody_listening_is_unavailable(client: ServiceClient) -> None:
    with pytest.raises(Unavailable) as down:
        await client.call(NOBODY, Echo(text="hi"))
    assert down.value.service == "registry"
    assert "no responders" in down.value.reason


async def test_a_silent_service_is_unavailable_after_the_timeout(client: ServiceClient) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Unavailable) as down:
        await client.call(SILENT, Echo(text="hi"), wait_s=0.3)
    assert "within 0.3s" in down.value.reason
    assert loop.time() - started < 2


async def test_a_garbled_reply_is_an_internal_refusal(client: ServiceClient) -> None:
    with pytest.raises(Refused) as refused:
        await client.call(GARBLED, Echo(text="hi"))
    assert refused.value.code == "internal"
    assert "malformed reply" in refused.value.message


async def test_a_closed_connection_is_unavailable(client: ServiceClient, nc: Client) -> None:
    await nc.close()
    with pytest.raises(Unavailable, match="NATS unavailable"):
        await client.call(SHOUT, Echo(text="hi"))


def test_a_refusal_of_an_older_service_without_a_code_reads_as_invalid() -> None:
    reply = Reply[Shout].model_validate_json(b'{"ok": false, "error": "no"}')
    assert reply.error_code == "invalid"

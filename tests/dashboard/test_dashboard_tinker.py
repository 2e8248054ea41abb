"""The dashboard's "Training sessions" panel, its data: ``GET /v1/tinker/overview`` after real
Tinker calls over the gateway's ``/api/v1`` routes, answered by a stand-in worker on the real
NATS subjects (no model: what is checked is the gateway's counting and timing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from swarm_contracts.jobs import ModelRef
from swarm_contracts.replies import Reply
from swarm_contracts.sessions import SessionCall, SessionResult
from swarm_contracts.subjects import Subjects
from swarm_gateway.app import create_app
from swarm_gateway.settings import GatewaySettings
from swarm_gateway.tinker.records import ModelRecord, model_token
from swarm_runtime.settings import Settings

ALICE, BOB, ADMIN = "ka", "kb", "kadmin"
WORKER = "stand-in"
# What the stand-in worker says it computed, and how long it holds each call in all: the
# gateway's queue time is the rest. 0.04 s falls in the histogram's 0.05 bucket.
COMPUTE_S = 0.04
HOLD_S = 0.3


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    keyed = GatewaySettings.of(settings, api_keys=f"{ALICE}=alice,{BOB}=bob", admin_keys=ADMIN)
    app = create_app(keyed, submit_wait_s=0.3, request_timeout_s=1.0)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        yield app, c


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[list[SessionCall]]:
    """Answers every session call after ``HOLD_S``, saying it computed ``COMPUTE_S``; refuses
    an optim_step whose seq_id is 99 as the real worker refuses bad input."""
    nc = await nats.connect(settings.nats_url)
    heard: list[SessionCall] = []

    async def answer(msg: Msg) -> None:
        call = SessionCall.model_validate_json(msg.data)
        heard.append(call)
        await asyncio.sleep(HOLD_S)
        if call.op == "optim_step" and call.seq_id == 99:
            reply = Reply[SessionResult](ok=False, code="invalid", error="no forward_backward")
        else:
            reply = Reply[SessionResult](
                ok=True, result=SessionResult(step=call.seq_id, compute_s=COMPUTE_S)
            )
        await msg.respond(reply.model_dump_json().encode())

    sub = await nc.subscribe(Subjects(settings.namespace).worker_session(WORKER), cb=answer)
    try:
        yield heard
    finally:
        await sub.unsubscribe()
        await nc.close()


def tml(key: str) -> dict[str, str]:
    return {"X-API-Key": f"tml-{key}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def a_ready_model(app: Any, c: httpx.AsyncClient, key: str, tenant: str) -> str:
    """A session made over the API, and its model as ``create_model`` leaves it once the worker
    built it (building is the trainer's: tests/e2e/test_tinker.py)."""
    resp = await c.post("/api/v1/create_session", json={}, headers=tml(key))
    session_id = resp.json()["session_id"]
    model_id = f"{session_id}:train:0"
    record = ModelRecord(
        model_id=model_id,
        session_id=session_id,
        tenant=tenant,
        worker_id=WORKER,
        base_model=ModelRef(
            name="tiny-llama", version=1, store_key="models/tiny-llama/1", digest="0" * 64
        ),
        base_model_name="tiny-llama",
        rank=4,
        state="ready",
    )
    await app.state.tinker.models.put(model_token(model_id), record)
    return model_id


async def call(c: httpx.AsyncClient, key: str, route: str, body: dict[str, Any]) -> str:
    resp = await c.post(f"/api/v1/{route}", json=body, headers=tml(key))
    assert resp.status_code == 200, resp.text
    request_id: str = resp.json()["request_id"]
    return request_id


async def until(
    read: Callable[[], Awaitable[dict[str, Any]]], ok: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The overview once ``ok``: a call is counted as it settles, just after its reply."""
    deadline = time.monotonic() + 20
    while True:
        body = await read()
        if ok(body):
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)


def by_op(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["op"]: o for o in body["ops"]}


async def test_the_overview_counts_and_times_each_tenants_calls(
    gateway: tuple[Any, httpx.AsyncClient], worker: list[SessionCall]
) -> None:
    app, c = gateway

    async def overview(key: str, query: str = "") -> dict[str, Any]:
        resp = await c.get(f"/v1/tinker/overview{query}", headers=bearer(key))
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body

    assert (await c.get("/v1/tinker/overview")).status_code == 401
    empty = await overview(ALICE)
    assert (empty["ops"], empty["models"], empty["sessions"]) == ([], [], 0)
    assert empty["states"] == ["done", "failed"]
    assert empty["parts"] == ["total", "compute", "queue"]

    alice = await a_ready_model(app, c, ALICE, "alice")
    bob = await a_ready_model(app, c, BOB, "bob")
    adam = {"adam_params": {"learning_rate": 1e-3}}
    # Alice: three steps done (sent together: each waits behind the one before), one
    # refused, and a save; Bob: one step.
    for seq in (1, 2, 3, 99):
        await call(c, ALICE, "optim_step", {"model_id": alice, "seq_id": seq, **adam})
    await call(c, ALICE, "save_weights", {"model_id": alice, "seq_id": 4, "path": "first"})
    await call(c, BOB, "optim_step", {"model_id": bob, "seq_id": 1, **adam})

    def settled(n: int) -> Callable[[dict[str, Any]], bool]:
        return lambda body: sum(sum(o["calls"].values()) for o in body["ops"]) == n

    mine = by_op(await until(lambda: overview(ALICE), settled(5)))
    assert list(mine) == ["optim_step", "save_state"]  # the contract's order
    step = mine["optim_step"]
    assert step["calls"] == {"done": 3, "failed": 1}
    compute, queue, total = (step["timing"][p] for p in ("compute", "queue", "total"))
    # A refused call has no compute time: only the three done ones are timed.
    assert compute["count"] == queue["count"] == total["count"] == 3
    assert compute["mean_s"] == pytest.approx(COMPUTE_S)
    assert (compute["p50_le_s"], compute["p90_le_s"]) == (0.05, 0.05)
    # The stand-in held each call HOLD_S, so each waited at least HOLD_S - COMPUTE_S, and the
    # three queued behind one another (the worker answers in turn): the queue's mean is
    # above that, and its p90 bucket at or above its p50's.
    assert queue["mean_s"] >= HOLD_S - COMPUTE_S
    assert total["mean_s"] == pytest.approx(queue["mean_s"] + COMPUTE_S)
    assert queue["p50_le_s"] >= HOLD_S - COMPUTE_S
    assert queue["p90_le_s"] >= queue["p50_le_s"]
    assert mine["save_state"]["calls"] == {"done": 1, "failed": 0}

    body = await overview(ALICE)
    # Alice's model, its latest save as the save's settlement recorded it; not Bob's.
    assert body["sessions"] == 1
    [model] = body["models"]
    assert (model["model_id"], model["tenant"], model["worker_id"]) == (alice, "alice", WORKER)
    assert (model["last_save"], model["last_save_step"]) == (f"tinker://{alice}/weights/first", 4)

    # Bob's call was answered after Alice's (the stand-in answers one at a time).
    theirs = await until(lambda: overview(BOB), settled(1))
    assert [(o["op"], o["calls"]) for o in theirs["ops"]] == [
        ("optim_step", {"done": 1, "failed": 0})
    ]
    assert [m["model_id"] for m in theirs["models"]] == [bob]
    # A tenant cannot ask for another's.
    assert (await overview(BOB, "?tenant=alice"))["models"] == theirs["models"]

    everyone = await overview(ADMIN)
    assert by_op(everyone)["optim_step"]["calls"] == {"done": 4, "failed": 1}
    assert by_op(everyone)["optim_step"]["timing"]["compute"]["count"] == 4
    assert {m["model_id"] for m in everyone["models"]} == {alice, bob}
    assert everyone["sessions"] == 2
    one = await overview(ADMIN, "?tenant=bob")
    assert by_op(one) == by_op(theirs)

    # Finishing the session closes its model (a close call to the worker, counted too): it
    # is no longer held.
    session_id = alice.split(":")[0]
    resp = await c.post(
        f"/api/v1/sessions/{session_id}/finish",
        json={"reason": {"type": "success"}},
        headers=tml(ALICE),
    )
    assert resp.status_code == 200, resp.text
    closed = await until(lambda: overview(ALICE), settled(6))
    assert (closed["models"], closed["sessions"]) == ([], 0)
    assert by_op(closed)["close"]["calls"] == {"done": 1, "failed": 0}
    assert [heard.op for heard in worker].count("optim_step") == 5

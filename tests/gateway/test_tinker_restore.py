"""The gateway's restore of a training model off a lost worker (swarm_gateway.tinker.sessions),
against a real scheduler, registry and nats-server; the workers are heartbeats and a NATS
subscriber standing in for the worker's session subject.

A model made from a saved state and not saved since is built again from that state, not from
fresh weights; a model whose own ``create`` was lost moves with its future, which the new
worker answers and a late reply of the lost one cannot settle."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nats.aio.msg import Msg

from swarm_contracts.replies import Reply
from swarm_contracts.sessions import CreateSession, SessionCall, SessionResult
from swarm_gateway.tinker import sessions
from swarm_gateway.tinker.calls import Calls
from swarm_gateway.tinker.follow_ups import FollowUps
from swarm_gateway.tinker.records import (
    FollowUp,
    FutureRecord,
    ModelRecord,
    SamplerRecord,
    model_token,
)
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import ServiceClient
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

from ..scheduler.conftest import Harness, running_harness
from ..scheduler.test_session_leases import BASE

MODEL_ID = "tsess-0123456789abcdef:train:0"
TOKEN = model_token(MODEL_ID)
STATE = "tinker/a/tsess-fedcba9876543210-train-0/weights/best"


class Worker:
    """What reaches a worker's session subject; it answers each call as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[SessionCall, Msg]] = []

    async def on_call(self, msg: Msg) -> None:
        self.calls.append((SessionCall.model_validate_json(msg.data), msg))

    async def wait_calls(self, n: int) -> None:
        for _ in range(100):
            if len(self.calls) >= n:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.calls)} calls reached the worker, not {n}")

    async def answer(self, index: int, step: int = 0) -> None:
        reply = Reply[SessionResult](ok=True, result=SessionResult(step=step))
        await self.calls[index][1].respond(reply.model_dump_json().encode())


async def tables(h: Harness) -> tuple[RecordTable[ModelRecord], Calls, Any]:
    """A gateway's Tinker tables and calls (as its app makes them)."""
    models = RecordTable(await kv_bucket(h.js, h.subjects, "tinker_models"), ModelRecord)
    futures = RecordTable(await kv_bucket(h.js, h.subjects, "tinker_futures"), FutureRecord)
    samplers = RecordTable(await kv_bucket(h.js, h.subjects, "tinker_samplers"), SamplerRecord)
    calls = Calls(h.nc, h.subjects, futures)
    await calls.start()
    calls.follow_up = FollowUps(models, samplers)
    gw = SimpleNamespace(scheduler=ServiceClient(h.nc, "scheduler", h.subjects.scheduler))
    return models, calls, gw


async def another_gateway(h: Harness, calls: Calls) -> Calls:
    """A second gateway's calls, on the same buckets."""
    other = Calls(h.nc, h.subjects, calls.futures)
    await other.start()
    other.follow_up = calls.follow_up
    return other


async def settled(calls: Calls, request_id: str) -> FutureRecord:
    for _ in range(100):
        found = await calls.futures.get(request_id)
        assert found is not None
        if found[0].state != "pending":
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"future {request_id} never settled")


async def create_on_w1(
    h: Harness, models: RecordTable[ModelRecord], calls: Calls, gw: Any
) -> FutureRecord:
    """The model placed on w1 (its lease's attempt 1, while w1 beat) and its ``create`` sent
    there, pending: w1 then stops heartbeating."""
    async with h.beating("w1", cpus=2):
        await asyncio.sleep(0.3)
        granted = await sessions.lease(gw, TOKEN, "a", BASE)
    assert (granted.worker_id, granted.attempt) == ("w1", 1)
    await models.put(TOKEN, record("w1", 1, CreateSession(base_model=BASE, rank=4)))
    first = FutureRecord(
        request_id=calls.new_id(),
        tenant="a",
        model_id=MODEL_ID,
        worker_id="w1",
        op="create",
        deadline=1e12,
    )
    await calls.send("w1", SessionCall(session=TOKEN, tenant="a", seq_id=0, op="create"), first)
    return first


async def placed_when_w2_comes(h: Harness, calls: Calls, request_id: str) -> FutureRecord:
    """Worker w2 comes: the waiting create reaches it (once), it answers, the future settles."""
    w2 = Worker()
    await h.nc.subscribe(h.subjects.worker_session("w2", "*"), cb=w2.on_call)
    async with h.beating("w2", cpus=2):
        await w2.wait_calls(1)
        await asyncio.sleep(0.1)
        assert len(w2.calls) == 1
        await w2.answer(0)
        return await settled(calls, request_id)


def record(worker: str, attempt: int, create: CreateSession) -> ModelRecord:
    return ModelRecord(
        model_id=MODEL_ID,
        session_id="tsess-0123456789abcdef",
        tenant="a",
        worker_id=worker,
        attempt=attempt,
        base_model=BASE,
        base_model_name="tiny",
        rank=4,
        create=create,
    )


async def test_a_model_made_from_a_saved_state_is_restored_from_it(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path) as h, h.beating("w2", cpus=2):
        models, calls, gw = await tables(h)
        w2 = Worker()
        await h.nc.subscribe(h.subjects.worker_session("w2", "*"), cb=w2.on_call)
        create = CreateSession(base_model=BASE, rank=4, load_key=STATE, load_optimizer=True)
        await models.put(TOKEN, record("w1", 1, create))
        await asyncio.sleep(0.3)  # w2's first heartbeat

        told = await sessions.restore(gw, models, calls, TOKEN, "w1")  # type: ignore[arg-type]
        assert told is not None
        assert "restored on worker w2 from the saved state it was created from" in told
        assert told.endswith("training resumes from that state's step")
        await w2.wait_calls(1)
        call = w2.calls[0][0]
        assert call.op == "create"
        assert call.create is not None
        assert (call.create.load_key, call.create.load_optimizer) == (STATE, True)
        assert call.attempt_token  # what a worker without store keys asks the registry with
        found = await models.get(TOKEN)
        assert found is not None
        assert (found[0].worker_id, found[0].attempt) == ("w2", call.attempt)


async def test_a_lost_create_moves_with_its_future_and_a_late_reply_is_not_heard(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path) as h:
        models, calls, gw = await tables(h)
        w1, w2 = Worker(), Worker()
        await h.nc.subscribe(h.subjects.worker_session("w1", "*"), cb=w1.on_call)
        await h.nc.subscribe(h.subjects.worker_session("w2", "*"), cb=w2.on_call)
        first = await create_on_w1(h, models, calls, gw)

        # w1 is lost before it built anything (it stopped heartbeating); w2 is alive.
        async with h.beating("w2", cpus=2):
            await asyncio.sleep(0.3)
            moved = await sessions.restore(gw, models, calls, TOKEN, "w1", moving=first)  # type: ignore[arg-type]
        assert moved is None  # nothing to tell: the client's future is still pending
        await w1.wait_calls(1)
        await w2.wait_calls(1)
        again = w2.calls[0][0]
        assert again.attempt == 2
        pending = await calls.futures.get(first.request_id)
        assert pending is not None
        assert (pending[0].state, pending[0].worker_id) == ("pending", "w2")

        await w1.answer(0, step=99)  # the lost worker wakes and answers: stale
        await asyncio.sleep(0.3)
        assert (await calls.futures.get(first.request_id))[0].state == "pending"  # type: ignore[index]
        await w2.answer(0, step=0)
        done = await settled(calls, first.request_id)
        assert (done.state, done.attempt) == ("done", again.attempt)
        assert done.result is not None
        assert done.result.step == 0
        assert (await models.get(TOKEN))[0].state == "ready"  # type: ignore[index]


async def test_a_lost_create_with_no_other_worker_free_waits_for_one(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path) as h:
        models, calls, gw = await tables(h)
        first = await create_on_w1(h, models, calls, gw)

        # No worker but the lost one: the create waits for room, as a new model's does.
        assert await sessions.restore(gw, models, calls, TOKEN, "w1", moving=first) is None  # type: ignore[arg-type]
        waiting = await calls.futures.get(first.request_id)
        assert waiting is not None
        assert (waiting[0].state, waiting[0].worker_id) == ("pending", None)
        assert waiting[0].waiting
        assert (await models.get(TOKEN))[0].state == "queued"  # type: ignore[index]
        done = await placed_when_w2_comes(h, calls, first.request_id)
        assert (done.state, done.worker_id, done.attempt) == ("done", "w2", 2)


def waiting_create(gateway: str) -> FutureRecord:
    """A new model's ``create`` future waiting for room, asked for by ``gateway``."""
    return FutureRecord(
        request_id=Calls.new_id(),
        tenant="a",
        model_id=MODEL_ID,
        op="create",
        deadline=time.time() + 600,
        waiting="no worker has room",
        gateway=gateway,
        follow_up=sessions.BUILT,
    )


async def queued_model(models: RecordTable[ModelRecord]) -> None:
    queued = record("", 1, CreateSession(base_model=BASE, rank=4))
    await models.put(TOKEN, queued.model_copy(update={"state": "queued"}))


async def test_a_wait_for_room_whose_gateway_died_is_adopted(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path) as h:
        models, calls, gw = await tables(h)
        alive, dead = await another_gateway(h, calls), await another_gateway(h, calls)
        await dead.stop()  # its process died: nothing listens on its inbox
        third = await another_gateway(h, calls)
        await queued_model(models)

        # Its gateway answers: nobody adopts.
        kept = waiting_create(alive.inbox)
        await calls.futures.put(kept.request_id, kept)
        assert not await sessions.adopt(gw, models, calls, kept)  # type: ignore[arg-type]

        # Its gateway died: the first gateway to read the future adopts the wait, and another
        # one, reading it as it was, does not.
        orphan = waiting_create(dead.inbox)
        await calls.futures.put(orphan.request_id, orphan)
        assert await sessions.adopt(gw, models, calls, orphan)  # type: ignore[arg-type]
        assert not await sessions.adopt(gw, models, third, orphan)  # type: ignore[arg-type]
        adopted = await calls.futures.get(orphan.request_id)
        assert adopted is not None
        assert adopted[0].gateway == calls.inbox
        done = await placed_when_w2_comes(h, calls, orphan.request_id)
        assert (done.state, done.worker_id) == ("done", "w2")
        assert (await models.get(TOKEN))[0].state == "ready"  # type: ignore[index]


async def test_a_gateway_stops_waiting_once_another_adopted_its_wait(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path) as h:
        models, calls, gw = await tables(h)
        await queued_model(models)
        future = waiting_create(calls.inbox)
        await calls.futures.put(future.request_id, future)
        call = SessionCall(session=TOKEN, tenant="a", seq_id=0, op="create")
        task = sessions.wait_for_room(gw, models, calls, call, future, "no room")  # type: ignore[arg-type]
        await asyncio.sleep(sessions.ROOM_RETRY_S * 1.5)
        assert not task.done()

        # Taken for dead by another gateway (cut off from NATS a while), it lets the wait go.
        await calls.futures.modify(
            future.request_id, lambda f: f.model_copy(update={"gateway": "_INBOX.other"})
        )
        await asyncio.wait_for(task, sessions.ROOM_RETRY_S * 10)
        left = await calls.futures.get(future.request_id)
        assert left is not None
        assert (left[0].state, left[0].gateway) == ("pending", "_INBOX.other")


async def test_a_call_in_flight_when_its_gateway_died_is_answered_again(
    settings: Settings, tmp_path: Path
) -> None:
    """The worker answered into the dead gateway's inbox; the adopter asks for the answer
    again (``answer_again``, the call's seq_id and attempt) and settles the future with it,
    follow-up included: the save is the model's latest state."""
    async with running_harness(settings, tmp_path) as h:
        models, calls, gw = await tables(h)
        w1 = Worker()
        await h.nc.subscribe(h.subjects.worker_session("w1", "*"), cb=w1.on_call)
        await models.put(TOKEN, record("w1", 3, CreateSession(base_model=BASE, rank=4)))
        dead = await another_gateway(h, calls)
        save = FutureRecord(
            request_id=calls.new_id(),
            tenant="a",
            model_id=MODEL_ID,
            worker_id="w1",
            op="save_state",
            deadline=time.time() + 600,
            path=f"tinker://{MODEL_ID}/weights/two",
            follow_up=FollowUp(kind="saved", store_key=STATE),
        )
        call = SessionCall(session=TOKEN, tenant="a", seq_id=7, attempt=3, op="save_state")
        await dead.send("w1", call.model_copy(update={"store_key": STATE}), save)
        await dead.stop()
        await w1.wait_calls(1)
        await w1.answer(0, step=2)  # into the dead gateway's inbox: nobody hears it
        await asyncio.sleep(0.2)
        assert (await calls.futures.get(save.request_id))[0].state == "pending"  # type: ignore[index]

        sent = await calls.futures.get(save.request_id)
        assert sent is not None
        assert sent[0].gateway == dead.inbox
        assert await sessions.adopt(gw, models, calls, sent[0])  # type: ignore[arg-type]
        await w1.wait_calls(2)
        again = w1.calls[1][0]
        assert (again.op, again.seq_id, again.attempt) == ("answer_again", 7, 3)
        await w1.answer(1, step=2)
        done = await settled(calls, save.request_id)
        assert (done.state, done.gateway) == ("done", calls.inbox)
        latest = (await models.get(TOKEN))[0].last_state  # type: ignore[index]
        assert latest is not None
        assert (latest.path, latest.store_key, latest.step) == (save.path, STATE, 2)

"""Where a training model lives, and what happens when that worker is lost.

A model's room on a worker is leased by the scheduler like a job's (``lease``:
swarm_scheduler.session_leases: capacity, the tenant's fair share and limit, renewal by the
worker's heartbeats, an attempt number that fences the worker's calls and saves). A model that
finds no room waits for it (``wait_for_room``): its ``create`` future stays pending, read as
``paused_capacity`` with the scheduler's reason, rather than failing. Once leased, the model is
built by a ``create`` call. When that worker is lost (its subscription gone: NATS answers "no
responders"; or the scheduler no longer hears it, or ended its lease), the model is built again
on another worker (``restore``) from its latest ``save_state`` with the optimizer (or from its
initial weights when it has none), and the calls that were lost fail with a message that says
so and names the step training resumes from: the SDK's futures are not retried by the server,
so the client decides whether to redo them (docs/tinker.md, "Worker loss"). When the gateway
answering for a pending future dies, another adopts it (``adopt``: docs/tinker.md, "Gateway
loss").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.providers import token_digest
from swarm_contracts.sessions import (
    PLACE_SESSION,
    RELEASE_SESSION,
    PlaceSession,
    ReleaseSession,
    SessionCall,
    SessionLease,
)
from swarm_gateway.state import Gateway
from swarm_gateway.tinker.calls import Calls
from swarm_gateway.tinker.records import FollowUp, FutureRecord, ModelRecord, model_token
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused, Unavailable

log = logging.getLogger(__name__)

# A worker whose last heartbeat is older than this holding a session is taken for lost (the
# scheduler's own timeout is shorter: its state says so first).
FRESH_HEARTBEAT_S = 30.0
# How long a worker may take over one call before its future reads as failed; a model waiting
# for room waits as long.
CALL_TIMEOUT_S = 600.0
# How often a model waiting for room asks the scheduler again.
ROOM_RETRY_S = 1.0
# The follow-up of a create call: the model is ready (or failed).
BUILT = FollowUp(kind="built")
# The background placements of models waiting for room (kept referenced while they run).
_waiting: set[asyncio.Task[None]] = set()


class NoRoom(Exception):
    """Nothing fits the model now (or its tenant is at its limit): why, as the scheduler said."""


@dataclass(frozen=True)
class Granted:
    """A worker's room for the model (its lease's worker and attempt), and the attempt's token
    its ``create`` call carries: a worker holding no store keys asks the registry for the
    session's store access with it (the scheduler keeps only its digest)."""

    worker_id: str
    attempt: int
    token: str = field(repr=False)


async def lease(
    gw: Gateway,
    token: str,
    tenant: str,
    base: ModelRef,
    avoid: str | None = None,
    waiting_since: float | None = None,
) -> Granted:
    """The scheduler's lease of a worker's room for the model (``NoRoom`` if none now; a
    scheduler process that is not leading refuses, and the next is asked); ``waiting_since``
    (epoch s): when a waiting model first asked."""
    attempt_token = secrets.token_urlsafe(24)
    request = PlaceSession(
        session=token,
        tenant=tenant,
        base_model=base,
        avoid=avoid,
        attempt_token_sha256=token_digest(attempt_token),
        waiting_since=None if waiting_since is None else datetime.fromtimestamp(waiting_since, UTC),
    )
    for tries_left in reversed(range(5)):
        try:
            found: SessionLease = await gw.scheduler.call(PLACE_SESSION, request)
            return Granted(found.worker_id, found.attempt, attempt_token)
        except Refused as exc:
            if exc.code == "conflict":
                raise NoRoom(exc.message) from exc
            if exc.code != "internal" or not tries_left:
                raise
    raise AssertionError("unreachable")


async def release(gw: Gateway, record: ModelRecord, reason: str = "closed") -> None:
    """End the model's lease (best effort: a lease its worker stops renewing ends anyway)."""
    if not record.worker_id:
        return
    token = model_token(record.model_id)
    request = ReleaseSession(session=token, attempt=record.attempt, reason=reason)
    with contextlib.suppress(Refused, Unavailable):
        await gw.scheduler.call(RELEASE_SESSION, request)


def wait_for_room(
    gw: Gateway,
    models: RecordTable[ModelRecord],
    calls: Calls,
    call: SessionCall,
    future: FutureRecord,
    why: str,
) -> asyncio.Task[None]:
    """Ask for room again every ``ROOM_RETRY_S`` until the scheduler leases some (then send the
    ``create`` call) or the future's deadline passes (then it fails, saying why it waited).

    The future names this gateway as the one answering for it: were this gateway to die, the
    next ``retrieve_future`` another gateway answers adopts the wait (``adopt``)."""

    async def wait() -> None:
        waiting = why
        while time.time() < future.deadline:
            try:
                if not await _still_mine(calls, future):
                    return  # another gateway adopted it (this one was taken for dead), or done
                await asyncio.sleep(ROOM_RETRY_S)
                found = await models.get(call.session)
                if found is None or found[0].state != "queued":  # closed while it waited
                    await fail(calls, future, "the model was closed before it had room", "user")
                    return
                record = found[0]
                try:
                    base, since = record.base_model, future.sent_at
                    granted = await lease(gw, call.session, record.tenant, base, None, since)
                except (NoRoom, Refused, Unavailable) as exc:
                    if str(exc) != waiting:
                        waiting = str(exc)
                        await _note_waiting(calls, future, waiting)
                    continue
                await send_create(models, calls, call, future, granted)
                return
            except Exception:  # NATS away a moment: ask again at the next tick
                log.exception("training model %s: waiting for room", call.session)
                await asyncio.sleep(ROOM_RETRY_S)
        why_failed = f"no worker had room for the model in {CALL_TIMEOUT_S:.0f}s: {waiting}"
        await fail(calls, future, why_failed, "server")

    task = asyncio.create_task(wait())
    _waiting.add(task)
    task.add_done_callback(_waiting.discard)
    return task


async def _still_mine(calls: Calls, future: FutureRecord) -> bool:
    """Whether this gateway still asks for the waiting ``create`` (not: another adopted it,
    taking this one for dead, or it is settled)."""
    found = await calls.futures.get(future.request_id)
    if found is None:
        return False
    f = found[0]
    return f.state == "pending" and f.worker_id is None and f.gateway == calls.inbox


async def adopt(
    gw: Gateway, models: RecordTable[ModelRecord], calls: Calls, future: FutureRecord
) -> bool:
    """Answer for a pending future whose gateway died (its inbox no longer answers): a model's
    wait for room is asked for from here; a call in flight on a worker is asked for again
    (``answer_again``: the worker keeps its last answers), its reply coming here; a sample (run
    by the dead gateway itself) is run again from its request kept in the future. Whether this
    gateway adopted it: one adopter wins the compare-and-set."""
    dead = future.gateway
    if dead is None or dead == calls.inbox or await calls.answers(dead):
        return False

    def claim(f: FutureRecord) -> FutureRecord | None:
        if f.state != "pending" or f.gateway != dead:
            return None  # settled meanwhile, or another gateway adopted it first
        f.gateway = calls.inbox
        return f

    claimed = await calls.futures.modify(future.request_id, claim)
    if claimed is None:
        return False
    future = claimed[0]
    log.warning(
        "future %s (%s): adopted from the dead gateway %s", future.request_id, future.op, dead
    )
    if future.op == "sample":
        if future.resample is not None and calls.resample is not None:
            await calls.resample(future)
        else:
            why = "the gateway sampling it stopped before it finished: sample again"
            await fail(calls, future, why, "server")
        return True
    found = await models.get(model_token(future.model_id))
    if found is None or found[0].create is None:
        await fail(calls, future, "the gateway that sent the call stopped", "server")
        return True
    record = found[0]
    token = model_token(record.model_id)
    if future.worker_id is None:  # a create waiting for room
        call = SessionCall(
            session=token, tenant=record.tenant, seq_id=0, op="create", create=record.create
        )
        calls.expect(future.request_id)
        wait_for_room(gw, models, calls, call, future, future.waiting or "")
        return True
    again = SessionCall(
        session=token,
        tenant=record.tenant,
        seq_id=future.seq_id,
        attempt=future.attempt,
        op="answer_again",
    )
    await calls.send(future.worker_id, again, future)
    return True


async def fail(
    calls: Calls, future: FutureRecord, error: str, category: Literal["user", "server"]
) -> None:
    future.state, future.category, future.error, future.waiting = "failed", category, error, None
    await calls.futures.put(future.request_id, future)
    calls.settled(future.request_id, future)


async def _note_waiting(calls: Calls, future: FutureRecord, why: str) -> None:
    def note(f: FutureRecord) -> FutureRecord | None:
        if f.state != "pending":
            return None
        f.waiting = why
        return f

    await calls.futures.modify(future.request_id, note)


async def send_create(
    models: RecordTable[ModelRecord],
    calls: Calls,
    call: SessionCall,
    future: FutureRecord,
    granted: Granted,
) -> None:
    """The model has room: record where, and send it its ``create`` call."""

    def placed(r: ModelRecord) -> ModelRecord | None:
        if r.state != "queued":  # another gateway's wait placed it (this one was taken for dead)
            return None
        r.worker_id, r.attempt, r.state = granted.worker_id, granted.attempt, "creating"
        return r

    if await models.modify(call.session, placed) is None:
        log.warning("training model %s: placed by another gateway meanwhile", call.session)
        return
    future = future.model_copy(update={"worker_id": granted.worker_id, "waiting": None})
    call = call.model_copy(update={"attempt": granted.attempt, "attempt_token": granted.token})
    await calls.send(granted.worker_id, call, future)


async def worker_lost(gw: Gateway, worker_id: str) -> bool:
    """Whether the scheduler has given ``worker_id`` up (lost, gone) or not heard it lately."""
    found = await gw.workers.get(worker_id)
    if found is None:
        return True
    worker = found[0]
    stale = utcnow() - worker.last_heartbeat > timedelta(seconds=FRESH_HEARTBEAT_S)
    return worker.state in ("lost", "gone") or stale


async def restore(
    gw: Gateway,
    models: RecordTable[ModelRecord],
    calls: Calls,
    token: str,
    lost: str,
    moving: FutureRecord | None = None,
) -> str | None:
    """Build the model again on another worker than ``lost``, once (a model already moved off
    ``lost`` is left as it is); what the calls lost with ``lost`` should tell their caller.

    ``moving`` is the model's own ``create`` call, lost before it built anything: nothing is
    lost but time, so that call itself moves (its future stays pending, answered by the other
    worker; None is returned), waiting for room as a new model does where none is free now."""
    found = await models.get(token)
    if found is None:
        return f"worker {lost} holding this session was lost"
    record, revision = found
    if record.worker_id != lost:
        return record.restored or f"worker {lost} holding this session was lost"
    if record.create is None:  # made before models kept their spec: nothing to build from
        record.state, record.error = "failed", f"worker {lost} holding this model was lost"
        await models.update(token, record, revision)
        return record.error
    try:
        granted = await lease(gw, token, record.tenant, record.create.base_model, avoid=lost)
    except (NoRoom, Refused, Unavailable) as exc:
        if moving is not None and isinstance(exc, NoRoom):
            await _wait_again(gw, models, calls, record, revision, moving, str(exc))
            return None
        record.state = "failed"
        record.error = (
            f"worker {lost} holding this model was lost, and no other can hold it now ({exc})"
        )
        await models.update(token, record, revision)
        return record.error
    worker = granted.worker_id
    saved, create = record.last_state, record.create
    if saved is not None:  # its latest save_state, optimizer and step
        create = create.model_copy(update={"load_key": saved.store_key, "load_optimizer": True})
        since, resumes = f"save_state {saved.path} (step {saved.step})", f"step {saved.step}"
    elif create.load_key is not None:  # made from a saved state, not saved since
        since, resumes = "the saved state it was created from", "that state's step"
    else:
        since, resumes = "its initial weights", "step 0"
    if moving is None:
        record.restored = (
            f"worker {lost} holding this session was lost; the session is restored on worker "
            f"{worker} from {since}: calls made after that are lost, training resumes from "
            f"{resumes}"
        )
    record.worker_id, record.state, record.create = worker, "creating", create
    record.attempt = granted.attempt
    await models.update(token, record, revision)  # a concurrent restore fails here: one wins
    log.warning(
        "training model %s: %s",
        record.model_id,
        record.restored if moving is None else f"worker {lost} was lost building it: on {worker}",
    )
    call = SessionCall(
        session=token,
        tenant=record.tenant,
        seq_id=0,
        attempt=granted.attempt,
        op="create",
        create=create,
        attempt_token=granted.token,
    )
    deadline = utcnow().timestamp() + CALL_TIMEOUT_S
    if moving is not None:
        update = {"worker_id": worker, "deadline": deadline, "sent_at": time.time()}
        future = moving.model_copy(update=update | {"follow_up": BUILT})
    else:
        future = FutureRecord(
            request_id=calls.new_id(),
            tenant=record.tenant,
            model_id=record.model_id,
            worker_id=worker,
            op="create",
            deadline=deadline,
            follow_up=BUILT,
        )
    await calls.send(worker, call, future)
    return record.restored if moving is None else None


async def _wait_again(
    gw: Gateway,
    models: RecordTable[ModelRecord],
    calls: Calls,
    record: ModelRecord,
    revision: int,
    future: FutureRecord,
    why: str,
) -> None:
    """A ``create`` lost with its worker while no other has room: it waits for room as a new
    model's does (queued, its future answering ``paused_capacity``)."""
    assert record.create is not None
    token = model_token(record.model_id)
    record.worker_id, record.state = "", "queued"
    await models.update(token, record, revision)  # a concurrent restore fails here: one wins
    deadline = utcnow().timestamp() + CALL_TIMEOUT_S
    update = {"worker_id": None, "waiting": why, "deadline": deadline, "gateway": calls.inbox}
    future = future.model_copy(update=update | {"follow_up": BUILT})
    await calls.futures.put(future.request_id, future)
    calls.expect(future.request_id)
    log.warning("training model %s: its worker was lost building it; waiting: %s", token, why)
    call = SessionCall(
        session=token, tenant=record.tenant, seq_id=0, op="create", create=record.create
    )
    wait_for_room(gw, models, calls, call, future, why)

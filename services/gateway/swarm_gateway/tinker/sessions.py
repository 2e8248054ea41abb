"""Where a training model lives, and what happens when that worker is lost.

A model is placed on a live trainer of the cluster's own (``place``) and built there by a
``create`` call. When that worker is lost (its subscription gone: NATS answers "no responders";
or the scheduler no longer hears it), the model is built again on another worker (``restore``)
from its latest ``save_state`` with the optimizer (or from its initial weights when it has none),
and the calls that were lost fail with a message that says so and names the step training
resumes from: the SDK's futures are not retried by the server, so the client decides whether
to redo them (docs/tinker.md, "Worker loss").
"""

from __future__ import annotations

import logging
from datetime import timedelta

from fastapi import HTTPException, status

from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.sessions import SessionCall
from swarm_gateway.state import Gateway
from swarm_gateway.tinker.calls import Calls, OnSettled
from swarm_gateway.tinker.records import FutureRecord, ModelRecord
from swarm_runtime.records import RecordTable

log = logging.getLogger(__name__)

# A worker whose last heartbeat is older than this holds no new session, and one holding a
# session is taken for lost (the scheduler's own timeout is shorter: its state says so first).
FRESH_HEARTBEAT_S = 30.0
# How long a worker may take over one call before its future reads as failed.
CALL_TIMEOUT_S = 600.0


async def place(gw: Gateway, base: ModelRef, avoid: str | None = None) -> str:
    """A live worker of the cluster's own (sessions need its store keys), one that has the base
    model cached first, then the one with the most free CPUs; never ``avoid``."""
    fresh = utcnow() - timedelta(seconds=FRESH_HEARTBEAT_S)
    workers = [
        w
        for w in await gw.workers.all()
        if w.state == "alive"
        and w.provider is None
        and not (w.cordoned or w.draining or w.suspect)
        and w.last_heartbeat >= fresh
        and w.worker_id != avoid
    ]
    if not workers:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, detail="no trainer worker can hold a session now"
        )
    best = max(workers, key=lambda w: (base.digest in w.cached_models, w.free.cpus, w.worker_id))
    return best.worker_id


async def worker_lost(gw: Gateway, worker_id: str) -> bool:
    """Whether the scheduler has given ``worker_id`` up (lost, gone) or not heard it lately."""
    found = await gw.workers.get(worker_id)
    if found is None:
        return True
    worker = found[0]
    stale = utcnow() - worker.last_heartbeat > timedelta(seconds=FRESH_HEARTBEAT_S)
    return worker.state in ("lost", "gone") or stale


def built(models: RecordTable[ModelRecord], token: str) -> OnSettled:
    """The ``create`` call's settlement: the model is ready (with its context length), or failed."""

    async def settle_model(future: FutureRecord) -> FutureRecord:
        def settle(r: ModelRecord) -> ModelRecord:
            if future.state == "done" and future.result is not None:
                context = future.result.model_info.get("max_context")
                r.max_context = context if isinstance(context, int) else None
                r.state = "ready"
            else:
                r.state, r.error = "failed", future.error
            return r

        await models.modify(token, settle)
        return future

    return settle_model


async def restore(
    gw: Gateway,
    models: RecordTable[ModelRecord],
    calls: Calls,
    token: str,
    lost: str,
) -> str:
    """Build the model again on another worker than ``lost``, once (a model already moved off
    ``lost`` is left as it is); what the calls lost with ``lost`` should tell their caller."""
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
        worker = await place(gw, record.create.base_model, avoid=lost)
    except HTTPException:
        record.state = "failed"
        record.error = f"worker {lost} holding this model was lost, and no other can hold it"
        await models.update(token, record, revision)
        return record.error
    saved = record.last_state
    create = record.create.model_copy(
        update={
            "load_key": saved.store_key if saved else None,
            "load_optimizer": saved is not None,
        }
    )
    since = f"save_state {saved.path} (step {saved.step})" if saved else "its initial weights"
    step = saved.step if saved else 0
    record.restored = (
        f"worker {lost} holding this session was lost; the session is restored on worker "
        f"{worker} from {since}: calls made after that are lost, training resumes from step "
        f"{step}"
    )
    record.worker_id, record.state, record.create = worker, "creating", create
    await models.update(token, record, revision)  # a concurrent restore fails here: one wins
    log.warning("training model %s: %s", record.model_id, record.restored)
    call = SessionCall(session=token, tenant=record.tenant, seq_id=0, op="create", create=create)
    future = FutureRecord(
        request_id=calls.new_id(),
        tenant=record.tenant,
        model_id=record.model_id,
        worker_id=worker,
        op="create",
        deadline=utcnow().timestamp() + CALL_TIMEOUT_S,
    )
    await calls.send(worker, call, future, built(models, token))
    return record.restored

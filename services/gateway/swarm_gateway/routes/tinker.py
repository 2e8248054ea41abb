"""``/api/v1/*``: the Tinker training API, as the stock ``tinker`` SDK speaks it (docs/tinker.md).

The SDK's key is a Swarm API key with ``tml-`` in front (the SDK insists on that prefix), sent as
``X-API-Key``; tenants are the same as everywhere else. Training calls answer a future at once
(``{"request_id"}``); ``retrieve_future`` long-polls it (``try_again`` while it is pending).

Long because: one protocol surface, every route the stock SDK calls (start-up, sessions,
models, training calls, futures), read side by side with the SDK.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from swarm_contracts.jobs import ModelRef, utcnow
from swarm_contracts.layout import join_key, output_prefix, session_saves
from swarm_contracts.registry import GetModel, ListModels, ModelVersion
from swarm_contracts.registry_api import GET_MODEL, LIST_MODELS
from swarm_contracts.sessions import (
    ATTENTION_MODULES,
    LOSSES,
    MLP_MODULES,
    REQUIRED_CONFIG,
    AdamStep,
    CreateSession,
    Op,
    SessionCall,
    SessionResult,
)
from swarm_gateway.auth import DEFAULT_TENANT, KeyTable
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.tinker import sessions
from swarm_gateway.tinker.calls import Calls
from swarm_gateway.tinker.records import (
    FollowUp,
    FutureRecord,
    ModelRecord,
    SamplerRecord,
    SessionRecord,
    model_token,
)
from swarm_gateway.tinker.wire import (
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from swarm_runtime.record_cache import RecordCache
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused

router = APIRouter(prefix="/api/v1", tags=["tinker"])
GW = Annotated[Gateway, Depends(get_gateway)]

# How long one retrieve_future waits for a pending future before answering try_again.
LONG_POLL_S = 20.0
# A call pending longer than this has its worker's liveness checked at each read.
LOST_CHECK_S = 2.0
_CHECKPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SESSION_ID = re.compile(r"^tsess-[0-9a-f]{16}$")


class Tables:
    """The gateway's Tinker state (swarm_gateway.tinker.records), made in the app's lifespan."""

    def __init__(
        self,
        sessions: RecordTable[SessionRecord],
        models: RecordTable[ModelRecord],
        futures: RecordTable[FutureRecord],
        calls: Calls,
        samplers: RecordTable[SamplerRecord],
        model_list: RecordCache[ModelRecord],
    ) -> None:
        self.sessions = sessions
        self.models = models
        # The models as a watch keeps them: the dashboard's listing, polled every second.
        self.model_list = model_list
        self.futures = futures
        self.calls = calls
        self.samplers = samplers
        # Sampling runs in tasks of this gateway's (their futures are records like any other).
        self.tasks: set[asyncio.Task[None]] = set()


def tables(request: Request) -> Tables:
    """The session tables, for a handler that needs NATS: a 503 at once while NATS is away,
    as for every other route (``get_gateway``)."""
    get_gateway(request)
    found: Tables = request.app.state.tinker
    return found


T = Annotated[Tables, Depends(tables)]


def tinker_tenant(request: Request) -> str:
    """The caller's tenant from ``X-API-Key: tml-<Swarm key>`` (or a Bearer key)."""
    keys: KeyTable = request.app.state.api_keys
    if not keys:
        return DEFAULT_TENANT
    presented = request.headers.get("x-api-key", "")
    if not presented:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    if not presented:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="missing API key: X-API-Key")
    principal = keys.lookup(presented)
    if principal is None and presented.startswith("tml-"):
        principal = keys.lookup(presented.removeprefix("tml-"))
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="unknown API key")
    return principal.tenant


Tenant = Annotated[str, Depends(tinker_tenant)]


class Lenient(BaseModel):
    # The SDK sends fields this server has no use for (user_metadata, type, ...).
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


# --- the SDK's start-up ----------------------------------------------------------------------


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/client/config")
async def client_config(tenant: Tenant) -> dict[str, Any]:
    return {
        "pjwt_auth_enabled": False,
        # One request per forward_backward, in order: a session's calls run in sequence.
        "parallel_fwdbwd_chunks": False,
        "proto_compress_fwdbwd": False,
        "use_pyqwest_transport": False,
    }


@router.post("/client/dynamic_config")
async def client_dynamic_config(tenant: Tenant) -> dict[str, Any]:
    return {}


@router.post("/telemetry")
async def telemetry(tenant: Tenant) -> dict[str, str]:
    # The SDK's own usage telemetry: accepted and dropped (Swarm keeps its own metrics).
    return {"status": "accepted"}


@router.get("/get_server_capabilities")
async def server_capabilities(gw: GW, tenant: Tenant) -> dict[str, Any]:
    models = await gw.registry.call(LIST_MODELS, ListModels())
    return {
        "supported_models": [
            {"model_name": m.hf_id or m.name, "trainable": True, "sampleable": True} for m in models
        ]
    }


class CreateSessionBody(Lenient):
    tags: list[str] = Field(default_factory=list)


@router.post("/create_session")
async def create_session(body: CreateSessionBody, t: T, tenant: Tenant) -> dict[str, str]:
    session_id = f"tsess-{secrets.token_hex(8)}"
    await t.sessions.create(session_id, SessionRecord(session_id=session_id, tenant=tenant))
    return {"type": "create_session", "session_id": session_id}


class HeartbeatBody(Lenient):
    session_id: str


@router.post("/session_heartbeat")
async def session_heartbeat(body: HeartbeatBody, t: T, tenant: Tenant) -> dict[str, str]:
    await session_of(t, tenant, body.session_id)
    return {"type": "session_heartbeat"}


class FinishReason(Lenient):
    type: Literal["success", "errored", "interrupted"]


class FinishBody(Lenient):
    reason: FinishReason
    detail: str | None = Field(default=None, max_length=4096)


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, body: FinishBody, gw: GW, t: T, tenant: Tenant) -> None:
    """``ServiceClient.close``: the session ends (the first reason stays), its models are
    closed and freed on their workers; later calls on them are a 409."""
    record = await session_of(t, tenant, session_id, finished_too=True)
    if record.finished is None:

        def finish(r: SessionRecord) -> SessionRecord:
            r.finished = r.finished or body.reason.type
            r.finished_at = r.finished_at or utcnow()
            return r

        await t.sessions.modify(session_id, finish)
    for token in await t.models.keys():
        if token.startswith(f"{session_id}-train-"):
            await _close_model(gw, t, token)


async def _close_model(gw: Gateway, t: Tables, token: str) -> None:
    def close(r: ModelRecord) -> ModelRecord | None:
        if r.state == "closed":
            return None
        r.state = "closed"
        return r

    written = await t.models.modify(token, close)
    if written is None:
        return
    record = written[0]
    if record.worker_id:  # else it was still waiting for room
        call = SessionCall(session=token, tenant=record.tenant, seq_id=0, op="close")
        await _send(t, record, call)
    await sessions.release(gw, record)


# --- models ----------------------------------------------------------------------------------


class LoraBody(Lenient):
    rank: int = Field(ge=1, le=256)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModelBody(Lenient):
    session_id: str
    model_seq_id: int = Field(ge=0, le=999_999)
    base_model: str = Field(min_length=1, max_length=256)
    lora_config: LoraBody | None = None


@router.post("/create_model")
async def create_model(body: CreateModelBody, gw: GW, t: T, tenant: Tenant) -> dict[str, str]:
    await session_of(t, tenant, body.session_id)
    base = await base_model_of(gw, body.base_model)
    lora = body.lora_config or LoraBody(rank=32)
    create = CreateSession(
        base_model=base,
        rank=lora.rank,
        seed=lora.seed,
        train_mlp=lora.train_mlp,
        train_attn=lora.train_attn,
        train_unembed=lora.train_unembed,
    )
    return await _create(gw, t, tenant, body.session_id, body.model_seq_id, create, body.base_model)


async def _create(
    gw: Gateway,
    t: Tables,
    tenant: str,
    session_id: str,
    model_seq_id: int,
    create: CreateSession,
    base_model_name: str,
    path: str | None = None,
) -> dict[str, str]:
    """Place and build a new training model (``create.load_key``: from saved state, whose
    ``path`` the call's future then answers, as for a load)."""
    model_id = f"{session_id}:train:{model_seq_id}"
    token = model_token(model_id)
    try:
        granted: sessions.Granted | None = await sessions.lease(
            gw, token, tenant, create.base_model
        )
        waiting = ""
    except sessions.NoRoom as exc:  # it waits for room: the future stays pending meanwhile
        granted, waiting = None, str(exc)
    record = ModelRecord(
        model_id=model_id,
        session_id=session_id,
        tenant=tenant,
        worker_id=granted.worker_id if granted else "",
        attempt=granted.attempt if granted else 1,
        state="creating" if granted else "queued",
        base_model=create.base_model,
        base_model_name=base_model_name,
        rank=create.rank,
        target_modules=create.target_modules,
        create=create,
    )
    await t.models.put(token, record)
    call = SessionCall(session=token, tenant=tenant, seq_id=0, op="create", create=create)
    if granted is not None:
        call.attempt_token = granted.token
        return await _send(t, record, call, follow_up=sessions.BUILT, path=path)
    future = _future(t, record, call, path, sessions.BUILT)
    future.waiting, future.gateway = waiting, t.calls.inbox
    await t.futures.put(future.request_id, future)
    t.calls.expect(future.request_id)
    sessions.wait_for_room(gw, t.models, t.calls, call, future, waiting)
    return {"request_id": future.request_id, "model_id": model_id}


class GetInfoBody(Lenient):
    model_id: str


@router.post("/get_info")
async def get_info(body: GetInfoBody, t: T, tenant: Tenant) -> dict[str, Any]:
    record = await model_of(t, tenant, body.model_id)
    return {
        "type": "get_info",
        "model_id": record.model_id,
        "model_data": {
            "arch": "lora",
            "model_name": record.base_model.hf_id or record.base_model_name,
            "tokenizer_id": record.base_model.hf_id,
        },
        "is_lora": True,
        "lora_rank": record.rank,
        "model_name": record.base_model_name,
    }


# --- training calls --------------------------------------------------------------------------


@router.post("/forward_backward")
async def forward_backward(request: Request, t: T, tenant: Tenant) -> dict[str, str]:
    try:
        fwd = decode_forward_backward(await request.body(), request.headers.get("content-encoding"))
    except WireError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=str(exc)) from exc
    if fwd.loss_fn not in LOSSES:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail=f"loss_fn: {fwd.loss_fn!r} is not served; served: {', '.join(LOSSES)}",
        )
    for key in REQUIRED_CONFIG.get(fwd.loss_fn, ()):
        if key not in fwd.config:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail=f"loss_fn_config.{key}: {fwd.loss_fn} needs it (a number)",
            )
    record = await ready_model(t, tenant, fwd.model_id)
    op: Op = "forward" if fwd.forward_only else "forward_backward"
    call = SessionCall(
        session=model_token(record.model_id),
        tenant=tenant,
        seq_id=fwd.seq_id,
        op=op,
        data=fwd.data,
        loss_fn=fwd.loss_fn,
        loss_fn_config=fwd.config,
    )
    return await _send(t, record, call)


class OptimStepBody(Lenient):
    model_id: str
    seq_id: int = Field(ge=1)
    adam_params: AdamStep


@router.post("/optim_step")
async def optim_step(body: OptimStepBody, t: T, tenant: Tenant) -> dict[str, str]:
    record = await ready_model(t, tenant, body.model_id)
    call = SessionCall(
        session=model_token(record.model_id),
        tenant=tenant,
        seq_id=body.seq_id,
        op="optim_step",
        adam=body.adam_params,
    )
    return await _send(t, record, call)


class SaveBody(Lenient):
    model_id: str
    seq_id: int = Field(ge=1)
    path: str | None = Field(default=None, description="a name for the checkpoint")
    sampling_session_seq_id: int | None = Field(
        default=None,
        ge=0,
        le=999_999_999,
        description="save_weights_and_get_sampling_client: also open this sampling session",
    )


@router.post("/save_weights")
async def save_weights(body: SaveBody, t: T, tenant: Tenant) -> dict[str, str]:
    """Adapter, optimizer and step; the model's latest is what a restore on another worker
    starts from (``tinker.sessions``)."""
    return await _save(t, tenant, body, "save_state", "weights")


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(body: SaveBody, t: T, tenant: Tenant) -> dict[str, str]:
    """The adapter alone, registered as a version of adapter ``<session>-train-<n>`` once saved
    (servable by ``/v1/chat/completions`` too, and what a sampling client samples from)."""
    return await _save(t, tenant, body, "save_weights_for_sampler", "sampler_weights")


class LoadBody(Lenient):
    model_id: str | None = None
    seq_id: int | None = Field(default=None, ge=1)
    path: str
    optimizer: bool = True
    # create_training_client_from_state: a new model of this session, built from the state.
    session_id: str | None = None
    model_seq_id: int | None = Field(default=None, ge=0, le=999_999)


@router.post("/load_weights")
async def load_weights(body: LoadBody, gw: GW, t: T, tenant: Tenant) -> dict[str, str]:
    source_model, kind, name = parse_path(body.path)
    if kind != "weights":
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail="path: load a save_state path (…/weights/…)"
        )
    source = await model_of(t, tenant, source_model, field="path")
    if body.model_id is None or body.seq_id is None:
        if body.session_id is None or body.model_seq_id is None:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail="model_id: give model_id and seq_id, or session_id and model_seq_id",
            )
        await session_of(t, tenant, body.session_id)
        # The saved adapter's own shape: the same base model, rank and modules.
        create = CreateSession(
            base_model=source.base_model,
            rank=source.rank,
            train_attn=any(m in ATTENTION_MODULES for m in source.target_modules),
            train_mlp=any(m in MLP_MODULES for m in source.target_modules),
            load_key=_store_key(source, kind, name),
            load_optimizer=body.optimizer,
        )
        return await _create(
            gw,
            t,
            tenant,
            body.session_id,
            body.model_seq_id,
            create,
            source.base_model_name,
            path=body.path,
        )
    record = await ready_model(t, tenant, body.model_id)
    call = SessionCall(
        session=model_token(record.model_id),
        tenant=tenant,
        seq_id=body.seq_id,
        op="load_state",
        store_key=_store_key(source, kind, name),
        optimizer=body.optimizer,
    )
    return await _send(t, record, call, path=body.path)


# --- futures ---------------------------------------------------------------------------------


class RetrieveBody(Lenient):
    request_id: str = Field(min_length=1, max_length=64)


@router.post("/retrieve_future", response_model=None)
async def retrieve_future(
    body: RetrieveBody, gw: GW, t: T, tenant: Tenant
) -> Response | dict[str, Any]:
    deadline = time.monotonic() + LONG_POLL_S
    # Ours are uuid4 hex; anything else (not even a valid KV key) names no future.
    known = re.fullmatch(r"[0-9a-f]{32}", body.request_id) is not None
    while True:
        found = await t.futures.get(body.request_id) if known else None
        if found is None or found[0].tenant != tenant:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail="request_id: no such future")
        future = found[0]
        if future.state == "pending" and time.time() > future.deadline:
            future.state, future.category = "failed", "server"
            future.error = "no answer from the worker holding this session in time"
        # Only a call pending a while is checked for a lost worker: a quick call must not pay
        # two more reads (the "no responders" answer covers a worker gone before the call).
        waited = time.time() - future.sent_at
        if future.state == "pending" and future.worker_id and waited > LOST_CHECK_S:
            lost = await _lost_with_its_worker(gw, t, future)
            if lost is not None:
                future.state, future.category, future.error = "failed", "server", lost
                await t.futures.put(future.request_id, future)
        if future.state == "pending" and waited > LOST_CHECK_S:  # its gateway died?
            await sessions.adopt(gw, t.models, t.calls, future)
        if future.state != "pending":
            return _answer(future)
        left = deadline - time.monotonic()
        if left <= 0:
            return _try_again(future)
        await t.calls.wait(future.request_id, min(left, 1.0))


async def _lost_with_its_worker(gw: Gateway, t: Tables, future: FutureRecord) -> str | None:
    """Why a pending call will never be answered (its worker was lost: the model is restored
    elsewhere, or was already), or None while its worker may still answer."""
    assert future.worker_id is not None
    found = await t.models.get(model_token(future.model_id))
    moved = found is not None and found[0].worker_id != future.worker_id
    if future.op == "create" and moved:
        return None  # another read is moving this create: its future follows
    if not moved and not await sessions.worker_lost(gw, future.worker_id):
        return None
    # A lost create moves itself (None: still pending, read again); a lost call fails.
    moving = future if future.op == "create" else None
    return await sessions.restore(
        gw, t.models, t.calls, model_token(future.model_id), future.worker_id, moving
    )


def _try_again(future: FutureRecord) -> dict[str, Any]:
    if future.waiting is not None:  # a model waiting for room on a worker
        return {
            "type": "try_again",
            "request_id": future.request_id,
            "queue_state": "paused_capacity",
            "queue_state_reason": future.waiting,
        }
    return {"type": "try_again", "request_id": future.request_id, "queue_state": "active"}


def _answer(future: FutureRecord) -> Response | dict[str, Any]:
    if future.state == "failed":
        return {"error": future.error or "failed", "category": future.category or "server"}
    if future.op == "sample" and future.sample is not None:
        return Response(encode_sample_response(future.sample), media_type="application/x-protobuf")
    if future.result is None:
        return {"error": future.error or "failed", "category": future.category or "server"}
    result: SessionResult = future.result
    if future.op in ("forward", "forward_backward"):
        return Response(encode_forward_backward_output(result), media_type="application/x-protobuf")
    if future.op == "create" and future.path is not None:  # created from saved state
        return {"type": "load_weights", "path": future.path, "model_id": future.model_id}
    if future.op == "create":
        return {"type": "create_model", "model_id": future.model_id}
    if future.op == "optim_step":
        return {"metrics": result.metrics}
    if future.op == "save_state":
        return {"type": "save_weights", "path": future.path}
    if future.op == "save_weights_for_sampler":
        answer = {"type": "save_weights_for_sampler", "path": future.path}
        if future.sampling_session_id is not None:
            answer["sampling_session_id"] = future.sampling_session_id
        return answer
    return {"type": "load_weights", "path": future.path, "model_id": future.model_id}


# --- helpers ---------------------------------------------------------------------------------


async def _send(
    t: Tables,
    record: ModelRecord,
    call: SessionCall,
    *,
    path: str | None = None,
    follow_up: FollowUp | None = None,
) -> dict[str, str]:
    future = _future(t, record, call, path, follow_up)
    # The lease's attempt fences the call: a worker holding another attempt refuses it.
    call = call.model_copy(update={"attempt": record.attempt})
    await t.calls.send(record.worker_id, call, future)
    return {"request_id": future.request_id, "model_id": record.model_id}


def _future(
    t: Tables,
    record: ModelRecord,
    call: SessionCall,
    path: str | None,
    follow_up: FollowUp | None = None,
) -> FutureRecord:
    return FutureRecord(
        request_id=t.calls.new_id(),
        tenant=record.tenant,
        model_id=record.model_id,
        worker_id=record.worker_id or None,
        op=call.op,
        deadline=time.time() + sessions.CALL_TIMEOUT_S,
        path=path,
        seq_id=call.seq_id,
        follow_up=follow_up,
    )


async def _save(t: Tables, tenant: str, body: SaveBody, op: Op, kind: str) -> dict[str, str]:
    record = await ready_model(t, tenant, body.model_id)
    name = body.path or f"step-{body.seq_id:06d}"
    if body.path is None and body.sampling_session_seq_id is not None:
        name = f"sampler-{body.sampling_session_seq_id}"
    if not _CHECKPOINT_NAME.fullmatch(name):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail="path: a name of letters, digits, '.', '_' and '-' (up to 128)",
        )
    path = f"tinker://{record.model_id}/{kind}/{name}"
    if op == "save_state":  # the model's latest, what a restore starts from
        store_key = _store_key(record, kind, name)
        follow_up = FollowUp(kind="saved", store_key=store_key)
    else:
        # Written where the registry takes a result from (a job's output), the call's
        # own id standing for the job: a retried call registers the version it made.
        job_id = f"{model_token(record.model_id)}-s{body.seq_id}"
        store_key = output_prefix(job_id, 1)
        sampler = None
        if body.sampling_session_seq_id is not None:
            sampler = f"{record.session_id}:sample:{body.sampling_session_seq_id}"
        follow_up = FollowUp(
            kind="registered", store_key=store_key, name=name, job_id=job_id, sampler_id=sampler
        )
    call = SessionCall(
        session=model_token(record.model_id),
        tenant=tenant,
        seq_id=body.seq_id,
        op=op,
        store_key=store_key,
    )
    return await _send(t, record, call, path=path, follow_up=follow_up)


def _store_key(record: ModelRecord, kind: str, name: str) -> str:
    return join_key(session_saves(record.tenant, model_token(record.model_id)), kind, name)


def parse_path(path: str) -> tuple[str, str, str]:
    parts = path.removeprefix("tinker://").split("/")
    if (
        not path.startswith("tinker://")
        or len(parts) != 3
        or not _CHECKPOINT_NAME.fullmatch(parts[2])
    ):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail="path: not tinker://<model_id>/<kind>/<name>"
        )
    return parts[0], parts[1], parts[2]


async def session_of(
    t: Tables, tenant: str, session_id: str, *, finished_too: bool = False
) -> SessionRecord:
    """The caller's session; a finished one is a 409 (but for ``finished_too``)."""
    found = await t.sessions.get(session_id) if _SESSION_ID.fullmatch(session_id) else None
    if found is None or found[0].tenant != tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="session_id: no such session")
    if found[0].finished is not None and not finished_too:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"session_id: the session is finished ({found[0].finished})",
        )
    return found[0]


async def model_of(t: Tables, tenant: str, model_id: str, field: str = "model_id") -> ModelRecord:
    token = model_token(model_id)
    found = await t.models.get(token) if re.fullmatch(r"[A-Za-z0-9_-]{1,80}", token) else None
    # Another tenant's model is no different from none.
    if found is None or found[0].tenant != tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"{field}: no such model")
    return found[0]


async def ready_model(t: Tables, tenant: str, model_id: str) -> ModelRecord:
    record = await model_of(t, tenant, model_id)
    if record.state == "failed":
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"model_id: the model failed: {record.error}"
        )
    if record.state == "closed":
        raise HTTPException(status.HTTP_409_CONFLICT, detail="model_id: the session is closed")
    return record


async def base_model_of(gw: Gateway, name: str) -> ModelRef:
    """By registry name (``name`` or ``name@version``), else by the Hugging Face id it was
    registered with."""
    model: ModelVersion | None = None
    registry_name, _, version = name.partition("@")
    try:
        model = await gw.registry.call(
            GET_MODEL,
            GetModel(name=registry_name, version=int(version) if version.isdigit() else None),
        )
    except Refused as exc:
        if exc.code != "not_found" and exc.code != "invalid":
            raise
        models = await gw.registry.call(LIST_MODELS, ListModels())
        matches = sorted((m for m in models if m.hf_id == name), key=lambda m: m.version)
        model = matches[-1] if matches else None
    if model is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"base_model: no model {name!r} in the registry"
        )
    return ModelRef(
        name=model.name,
        version=model.version,
        store_key=model.store_key,
        digest=model.digest,
        hf_id=model.hf_id,
    )

"""``/v1/jobs``: submit, list, show, cancel, pause, resume, verify, metrics and the SSE event
stream."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from swarm_contracts.envelope import envelope
from swarm_contracts.events import TERMINAL_EVENTS, CancelRequest, PauseRequest, ResumeRequest
from swarm_contracts.jobs import (
    JobRecord,
    JobSpec,
    JobState,
    job_id_for,
    unpausable,
    unresumable,
    unverifiable,
)
from swarm_contracts.memory import MemoryEstimate
from swarm_contracts.memory_estimate import estimate_memory
from swarm_contracts.metrics import GET_JOB_METRICS, GetJobMetrics, JobMetrics
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetModel, continued_spec, forked_spec
from swarm_contracts.registry_api import GET_MODEL
from swarm_contracts.verification import VerifyRequest
from swarm_gateway.auth import Caller, Principal, Tenant
from swarm_gateway.errors import field_error
from swarm_gateway.event_stream import LastEventId, follow, start_sequence
from swarm_gateway.job_checks import check_base_model, check_datasets, check_fork, check_parent
from swarm_gateway.job_submit import submit
from swarm_gateway.responses import FiniteJSONResponse
from swarm_gateway.state import Gateway, get_gateway
from swarm_runtime.rpc import Refused

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
GW = Annotated[Gateway, Depends(get_gateway)]


class JobList(BaseModel):
    data: list[JobRecord]
    next_cursor: str | None = None


async def _own_job(gw: Gateway, caller: Principal, job_id: str) -> JobRecord:
    found = await gw.jobs.get(job_id) if job_id.startswith("job-") else None
    # Another tenant's job is indistinguishable from a missing one: no probing of ids.
    if found is None or not (caller.admin or found[0].tenant == caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found")
    return found[0]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRecord,
    responses={
        200: {"model": JobRecord, "description": "a job with this Idempotency-Key already exists"},
        202: {
            "model": JobRecord,
            "description": "accepted; the scheduler has not created the record yet",
        },
    },
)
async def submit_job(
    spec: JobSpec,
    gw: GW,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> FiniteJSONResponse:
    job_id = job_id_for(tenant, idempotency_key or uuid.uuid4().hex)
    await check_datasets(gw, tenant, spec)
    await check_parent(gw, tenant, spec)
    await check_fork(gw, tenant, spec, job_id)
    await check_base_model(gw, spec)
    record, status_code = await submit(gw, tenant, spec, job_id)
    return FiniteJSONResponse(record.model_dump(mode="json"), status_code=status_code)


@router.post(
    "/estimate",
    response_model=MemoryEstimate,
    responses={404: {"description": "unknown base model"}},
)
async def estimate_job(spec: JobSpec, gw: GW, tenant: Tenant) -> MemoryEstimate:
    """The GPU memory the job would need per GPU (the same body as ``POST /v1/jobs``; nothing
    is submitted). The scheduler holds a GPU job to this estimate when it places it. With
    ``from_adapter`` the LoRA shape is the parent's, with ``from_checkpoint`` the source
    job's, as when the job runs."""
    parent = await check_parent(gw, tenant, spec)
    if parent is not None:
        spec = continued_spec(spec, parent)
    ref = Ref.parse_versioned(spec.base_model)
    fork = await check_fork(gw, tenant, spec)
    if fork is not None:  # the source's LoRA shape, on the source's base model version
        spec = forked_spec(spec, fork.lora)
        ref = Ref(name=fork.base_model.name, version=fork.base_model.version)
    try:
        model = await gw.registry.call(GET_MODEL, GetModel(name=ref.name, version=ref.version))
    except Refused as exc:
        if exc.code != "not_found":
            raise
        raise field_error(404, ["body", "base_model"], exc.message, "not_found") from exc
    if model.shape is None:
        raise field_error(
            422,
            ["body", "base_model"],
            f"model {model.name}@{model.version}: its config.json gives no decoder architecture "
            "(hidden size, layers, heads, MLP width, vocabulary) to estimate from",
        )
    return estimate_memory(model.shape, spec, f"{model.name}@{model.version}")


def _encode_cursor(record: JobRecord) -> str:
    raw = json.dumps([record.created_at.isoformat(), record.job_id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, job_id = json.loads(base64.urlsafe_b64decode(padded))
        return str(created_at), str(job_id)
    except Exception as exc:
        raise field_error(422, ["query", "cursor"], "invalid cursor") from exc


@router.get("", response_model=JobList)
async def list_jobs(
    gw: GW,
    caller: Caller,
    state: JobState | None = None,
    name: str | None = None,
    sweep: Annotated[str | None, Query(description="only the trials of this sweep")] = None,
    tenant: Annotated[str | None, Query(description="admins only: one tenant's jobs")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    # Not nullable: a query string has no null (an optional str is documented as one).
    cursor: Annotated[
        str, Query(pattern=r"^[A-Za-z0-9_-]*$", description="`next_cursor` of the page before")
    ] = "",
) -> Response:
    """The caller's jobs; an admin sees every tenant's (or one, with ``tenant``)."""
    if not caller.admin:
        tenant = caller.tenant
    records = [
        r
        for r in await gw.all_jobs()
        if (tenant is None or r.tenant == tenant)
        and (state is None or r.state == state)
        and (name is None or r.spec.name == name)
        and (sweep is None or (r.sweep is not None and r.sweep.id == sweep))
    ]
    # Newest first; the job id breaks ties so that the order (and the cursor) is total.
    records.sort(key=lambda r: (r.created_at.isoformat(), r.job_id), reverse=True)
    if cursor:
        after = _decode_cursor(cursor)
        records = [r for r in records if (r.created_at.isoformat(), r.job_id) < after]
    page = records[:limit]
    next_cursor = _encode_cursor(page[-1]) if len(records) > limit else None
    # The gateway's busiest read: pydantic's own JSON of the page (NaN and infinity as null,
    # as FiniteJSONResponse writes them) costs a fraction of FastAPI's re-validation and
    # json.dumps (which were 40% of the gateway's time under a listing load).
    page_json = JobList(data=page, next_cursor=next_cursor).model_dump_json()
    return Response(page_json, media_type="application/json")


@router.get("/{job_id}", response_model=JobRecord)
async def get_job(job_id: str, gw: GW, caller: Caller) -> JobRecord:
    return await _own_job(gw, caller, job_id)


@router.post("/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=JobRecord)
async def cancel_job(
    job_id: str,
    gw: GW,
    caller: Caller,
    reason: Annotated[str | None, Query(max_length=500)] = None,
) -> JobRecord:
    record = await _own_job(gw, caller, job_id)
    request = CancelRequest(job_id=job_id, reason=reason or "cancelled by request")
    await _control(gw, gw.subjects.cancel(job_id), "swarm.job.cancel", request, job_id)
    return record


@router.post(
    "/{job_id}/pause",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobRecord,
    responses={
        404: {"description": "no such job of the caller's tenant"},
        409: {
            "description": "the job is not running (queued, already paused, finished, being "
            "cancelled) or is a verification replay"
        },
    },
)
async def pause_job(
    job_id: str,
    gw: GW,
    caller: Caller,
    reason: Annotated[str | None, Query(max_length=500)] = None,
) -> JobRecord:
    """Checkpoint the running job and free its worker: its worker commits a checkpoint of the
    step it reached and hands the job back, and the job is ``paused`` (no worker, no lease,
    no capacity held) until it is resumed. Asking again while it is being paused changes
    nothing. Only a job a worker holds (assigned or running) can be paused."""
    record = await _own_job(gw, caller, job_id)
    if (problem := unpausable(record)) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=problem)
    request = PauseRequest(job_id=job_id, reason=reason or "paused by request")
    await _control(gw, gw.subjects.pause(job_id), "swarm.job.pause", request, job_id)
    return record


@router.post(
    "/{job_id}/resume",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobRecord,
    responses={
        404: {"description": "no such job of the caller's tenant"},
        409: {"description": "the job is not paused"},
    },
)
async def resume_job(
    job_id: str,
    gw: GW,
    caller: Caller,
    reason: Annotated[str | None, Query(max_length=500)] = None,
) -> JobRecord:
    """Queue the paused job again: its next attempt resumes from the checkpoint it was paused
    at, and trains on as if it had never stopped."""
    record = await _own_job(gw, caller, job_id)
    if (problem := unresumable(record)) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=problem)
    request = ResumeRequest(job_id=job_id, reason=reason or "resumed by request")
    await _control(gw, gw.subjects.resume(job_id), "swarm.job.resume", request, job_id)
    return record


async def _control(gw: Gateway, subject: str, kind: str, data: BaseModel, job_id: str) -> None:
    """A command about one job for the scheduler, kept on the control stream until it is read."""
    event = envelope("gateway", kind, data, subject=job_id)
    await gw.publish(
        subject,
        event.model_dump_json().encode(),
        stream=gw.subjects.control_stream,
        headers={"content-type": "application/json"},
    )


@router.post(
    "/{job_id}/verify",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobRecord,
    responses={
        404: {"description": "no such job of the caller's tenant"},
        409: {
            "description": "the job is not finished, not succeeded, or has fewer than two "
            "committed checkpoints to replay between"
        },
    },
)
async def verify_job(job_id: str, gw: GW, caller: Caller) -> JobRecord:
    """Replay part of the succeeded job on another worker (of another provider) and compare:
    the outcome comes as the job's ``verified`` event and in ``verification`` on its record.
    Asking again for the same attempt changes nothing."""
    record = await _own_job(gw, caller, job_id)
    if (problem := unverifiable(record)) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=problem)
    request = VerifyRequest(job_id=job_id)
    await _control(gw, gw.subjects.verify(job_id), "swarm.job.verify", request, job_id)
    return record


@router.get("/{job_id}/metrics", response_model=JobMetrics)
async def job_metrics(
    job_id: str,
    gw: GW,
    caller: Caller,
    max_points: Annotated[int | None, Query(ge=2, le=100_000)] = None,
) -> JobMetrics:
    await _own_job(gw, caller, job_id)
    request = GetJobMetrics(job_id=job_id, max_points=max_points)
    return await gw.telemetry.call(GET_JOB_METRICS, request)


@router.get(
    "/{job_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_events(
    job_id: str,
    request: Request,
    gw: GW,
    caller: Caller,
    last_event_id: LastEventId = "",
) -> EventSourceResponse:
    """Replays the job's events (SSE id = stream sequence), then follows until it ends.

    A client that reconnects with ``Last-Event-ID`` gets exactly the events after that one
    (``swarm_gateway.event_stream``).
    """
    await _own_job(gw, caller, job_id)
    start_seq = start_sequence(last_event_id)

    async def ends(name: str, data: bytes) -> bool:
        if name == "verified":  # after a verification the job is over, unless it is rerun
            return await _job_over(gw, job_id)
        return name in TERMINAL_EVENTS and await _ends_the_job(gw, job_id, data)

    events = follow(
        gw,
        gw.subjects.job_event(job_id, "*"),
        gw.subjects.events_stream,
        start_seq,
        request,
        ends=ends,
        over=lambda: _job_over(gw, job_id),
    )
    return EventSourceResponse(events, ping=10)


async def _ends_the_job(gw: Gateway, job_id: str, data: bytes) -> bool:
    """Whether a terminal event ends the job: not when a later attempt has taken over (the
    late ``failed`` of a worker that lost its lease, say), nor when the attempt's verification
    is done (its ``verified`` event, and what the verification made of the job, follow in the
    history), which the record tells. A verification still pending does not hold a live
    follower: its replay may wait long for a worker."""
    try:
        attempt = int(json.loads(data)["data"].get("attempt", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return True  # not ours to judge: end as the event says
    found = await gw.jobs.get(job_id)
    if found is None:
        return True
    record = found[0]
    v = record.verification
    verified = v is not None and v.attempt == attempt and v.outcome != "pending"
    return record.attempt <= attempt and not verified


async def _job_over(gw: Gateway, job_id: str) -> bool:
    # Asked every idle second of every follower: from memory, not a KV read each time.
    record = await gw.recent_job(job_id)
    return record is not None and record.state.terminal

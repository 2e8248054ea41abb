"""``/v1/jobs``: submit, list, show, cancel, metrics and the SSE event stream."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

import nats.errors
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from swarm_common.envelope import envelope
from swarm_common.events import TERMINAL_EVENTS, CancelRequest
from swarm_common.jobs import JobRecord, JobSpec, JobState, JobSubmission, job_id_for
from swarm_common.metrics import GetJobMetrics, JobMetrics
from swarm_common.registry import AdapterVersion, GetAdapter
from swarm_common.tracing import trace_headers
from swarm_gateway.auth import Caller, Principal, Tenant
from swarm_gateway.errors import field_error
from swarm_gateway.nats_api import call
from swarm_gateway.state import Gateway, get_gateway

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


async def _check_datasets(gw: Gateway, tenant: str, spec: JobSpec) -> None:
    for field in ("dataset", "validation"):
        dataset_id = getattr(spec, field)
        if dataset_id and await gw.datasets.get(f"{tenant}.{dataset_id}") is None:
            raise field_error(
                422,
                ["body", field],
                f"dataset {dataset_id} not found for tenant {tenant}: upload it via /v1/datasets",
                "not_found",
            )


async def _check_parent(gw: Gateway, tenant: str, spec: JobSpec) -> None:
    """Refuse at once a ``from_adapter`` that is unknown, another tenant's, or trained on
    another base model. The scheduler checks again when it pins the versions (which also
    covers jobs submitted over NATS, and a base model named without a version)."""
    if spec.from_adapter is None:
        return
    request = GetAdapter(name=spec.from_adapter, tenant=tenant)
    try:
        parent = await call(
            gw, "registry", gw.subjects.registry("adapters.get"), request, AdapterVersion
        )
    except HTTPException as exc:
        if exc.status_code != status.HTTP_404_NOT_FOUND:
            raise
        raise field_error(
            422,
            ["body", "from_adapter"],
            f"adapter {spec.from_adapter} not found for tenant {tenant}",
            "not_found",
        ) from exc
    model, _, version = spec.base_model.partition("@")
    mismatch = parent.lineage.base_model_mismatch(model, int(version) if version else None)
    if mismatch is not None:
        raise field_error(
            422,
            ["body", "from_adapter"],
            f"adapter {spec.from_adapter} was {mismatch}, not on {spec.base_model}",
        )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRecord,
    responses={
        200: {"description": "a job with this Idempotency-Key already exists"},
        202: {"description": "accepted; the scheduler has not created the record yet"},
    },
)
async def submit_job(
    spec: JobSpec,
    gw: GW,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JSONResponse:
    await _check_datasets(gw, tenant, spec)
    await _check_parent(gw, tenant, spec)
    job_id = job_id_for(tenant, idempotency_key or uuid.uuid4().hex)
    existing = await gw.jobs.get(job_id)
    if existing is not None:
        return JSONResponse(existing[0].model_dump(mode="json"), status_code=status.HTTP_200_OK)

    submission = JobSubmission(spec=spec, tenant=tenant, job_id=job_id)
    event = envelope("gateway", "swarm.job.submit", submission, subject=job_id)
    # The job's trace starts here; the scheduler continues it from the traceparent header.
    attributes = {"swarm.job_id": job_id, "swarm.tenant": tenant}
    with gw.tracer.start_as_current_span("gateway.submit", attributes=attributes):
        # Nats-Msg-Id = job id: a retried POST (same key) is dropped by the stream itself.
        await gw.js.publish(
            gw.subjects.submit,
            event.model_dump_json().encode(),
            stream=gw.subjects.submit_stream,
            headers={"Nats-Msg-Id": job_id, "content-type": "application/json", **trace_headers()},
        )
    if gw.metrics is not None:
        gw.metrics.submissions.inc()

    loop = asyncio.get_running_loop()
    deadline = loop.time() + gw.submit_wait_s
    delay = 0.02
    while loop.time() < deadline:
        found = await gw.jobs.get(job_id)
        if found is not None:
            return JSONResponse(
                found[0].model_dump(mode="json"), status_code=status.HTTP_201_CREATED
            )
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 0.25)
    pending = JobRecord(job_id=job_id, tenant=tenant, spec=spec, state=JobState.queued)
    return JSONResponse(pending.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED)


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
    tenant: Annotated[str | None, Query(description="admins only: one tenant's jobs")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> JobList:
    """The caller's jobs; an admin sees every tenant's (or one, with ``tenant``)."""
    if not caller.admin:
        tenant = caller.tenant
    records = [
        r
        for r in await gw.jobs.all()
        if (tenant is None or r.tenant == tenant)
        and (state is None or r.state == state)
        and (name is None or r.spec.name == name)
    ]
    # Newest first; the job id breaks ties so that the order (and the cursor) is total.
    records.sort(key=lambda r: (r.created_at.isoformat(), r.job_id), reverse=True)
    if cursor:
        after = _decode_cursor(cursor)
        records = [r for r in records if (r.created_at.isoformat(), r.job_id) < after]
    page = records[:limit]
    next_cursor = _encode_cursor(page[-1]) if len(records) > limit else None
    return JobList(data=page, next_cursor=next_cursor)


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
    event = envelope("gateway", "swarm.job.cancel", request, subject=job_id)
    await gw.js.publish(
        gw.subjects.cancel(job_id),
        event.model_dump_json().encode(),
        stream=gw.subjects.control_stream,
        headers={"content-type": "application/json"},
    )
    return record


@router.get("/{job_id}/metrics", response_model=JobMetrics)
async def job_metrics(
    job_id: str,
    gw: GW,
    caller: Caller,
    max_points: Annotated[int | None, Query(ge=2, le=100_000)] = None,
) -> JobMetrics:
    await _own_job(gw, caller, job_id)
    return await call(
        gw,
        "telemetry",
        gw.subjects.telemetry("metrics.get"),
        GetJobMetrics(job_id=job_id, max_points=max_points),
        JobMetrics,
    )


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
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> EventSourceResponse:
    """Replays the job's events (SSE id = stream sequence), then follows until it ends.

    A client that reconnects with ``Last-Event-ID`` gets exactly the events after that one:
    the id is the event's sequence in the events stream, and the replay starts one past it.
    """
    await _own_job(gw, caller, job_id)
    start_seq = 0
    if last_event_id:
        try:
            start_seq = int(last_event_id) + 1
            if start_seq < 1:
                raise ValueError(last_event_id)
        except ValueError as exc:
            raise field_error(
                422, ["header", "Last-Event-ID"], "must be a stream sequence"
            ) from exc
    return EventSourceResponse(_follow(gw, job_id, start_seq, request), ping=10)


async def _follow(
    gw: Gateway, job_id: str, start_seq: int, request: Request
) -> AsyncIterator[ServerSentEvent]:
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
        if start_seq > 0
        else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    sub = await gw.js.subscribe(
        gw.subjects.job_event(job_id, "*"),
        stream=gw.subjects.events_stream,
        ordered_consumer=True,
        config=config,
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                if await request.is_disconnected():
                    return
                # Caught up and the job is over (e.g. a reconnect after the terminal event):
                # nothing more will come, so end the stream instead of idling forever.
                if await _job_over(gw, job_id) and await _caught_up(sub):
                    return
                continue
            name = msg.subject.rsplit(".", 1)[-1]
            yield ServerSentEvent(
                data=msg.data.decode(), event=name, id=str(msg.metadata.sequence.stream)
            )
            if name in TERMINAL_EVENTS and await _ends_the_job(gw, job_id, msg.data):
                return
    finally:
        # The connection may already be closing on shutdown.
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _ends_the_job(gw: Gateway, job_id: str, data: bytes) -> bool:
    """Whether a terminal event ends the job: not when a later attempt has taken over (the
    late ``failed`` of a worker that lost its lease, say), which the record tells."""
    try:
        attempt = int(json.loads(data)["data"].get("attempt", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return True  # not ours to judge: end as the event says
    found = await gw.jobs.get(job_id)
    return found is None or found[0].attempt <= attempt


async def _job_over(gw: Gateway, job_id: str) -> bool:
    found = await gw.jobs.get(job_id)
    return found is not None and found[0].state.terminal


async def _caught_up(sub: JetStreamContext.PushSubscription) -> bool:
    """Nothing left on the server or in the client's buffer: a slow consumer is not caught up."""
    try:
        info = await sub.consumer_info()
    except Exception:
        return False
    return info.num_pending == 0 and sub.pending_msgs == 0

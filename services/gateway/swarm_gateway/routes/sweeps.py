"""``/v1/sweeps``: create, list, show (with the trials table), cancel and the SSE stream.

The gateway only validates and forwards: a sweep is created by the sweeps service when it
takes the submission from ``swarm.sweeps.submit`` (the sweep id derived from tenant and
``Idempotency-Key``, like a job's), and cancelled through ``swarm.sweeps.<id>.cancel``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from swarm_contracts.envelope import envelope
from swarm_contracts.sweeps import (
    SWEEP_TERMINAL_EVENTS,
    SweepCancelRequest,
    SweepDetail,
    SweepRecord,
    SweepSpec,
    SweepState,
    SweepSubmission,
    sweep_id_for,
)
from swarm_gateway.auth import Caller, Principal, Tenant
from swarm_gateway.event_stream import LastEventId, follow, start_sequence
from swarm_gateway.job_checks import check_base_model, check_datasets, check_parent
from swarm_gateway.responses import FiniteJSONResponse
from swarm_gateway.state import Gateway, get_gateway

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])
GW = Annotated[Gateway, Depends(get_gateway)]


class SweepList(BaseModel):
    data: list[SweepRecord]


async def _own_sweep(gw: Gateway, caller: Principal, sweep_id: str) -> SweepRecord:
    found = await gw.sweeps.get(sweep_id) if sweep_id.startswith("sweep-") else None
    # Another tenant's sweep is indistinguishable from a missing one.
    if found is None or not (caller.admin or found[0].tenant == caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"sweep {sweep_id} not found")
    return found[0]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepRecord,
    responses={
        200: {
            "model": SweepRecord,
            "description": "a sweep with this Idempotency-Key already exists",
        },
        202: {
            "model": SweepRecord,
            "description": "accepted; the sweeps service has not created the record yet",
        },
    },
)
async def create_sweep(
    spec: SweepSpec,
    gw: GW,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> FiniteJSONResponse:
    await check_datasets(gw, tenant, spec.base, ("body", "base"))
    await check_parent(gw, tenant, spec.base, ("body", "base"))
    await check_base_model(gw, spec.base, ("body", "base"))
    sweep_id = sweep_id_for(tenant, idempotency_key or uuid.uuid4().hex)
    existing = await gw.sweeps.get(sweep_id)
    if existing is not None:
        return FiniteJSONResponse(
            existing[0].model_dump(mode="json"), status_code=status.HTTP_200_OK
        )

    submission = SweepSubmission(spec=spec, tenant=tenant, sweep_id=sweep_id)
    event = envelope("gateway", "swarm.sweep.submit", submission, subject=sweep_id)
    await gw.publish(
        gw.subjects.sweep_submit,
        event.model_dump_json().encode(),
        stream=gw.subjects.sweeps_stream,
        headers={"Nats-Msg-Id": sweep_id, "content-type": "application/json"},
    )
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + gw.submit_wait_s, 0.02
    while loop.time() < deadline:
        found = await gw.sweeps.get(sweep_id)
        if found is not None:
            return FiniteJSONResponse(
                found[0].model_dump(mode="json"), status_code=status.HTTP_201_CREATED
            )
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 0.25)
    pending = SweepRecord(sweep_id=sweep_id, tenant=tenant, spec=spec)
    return FiniteJSONResponse(pending.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED)


@router.get("", response_model=SweepList)
async def list_sweeps(
    gw: GW,
    caller: Caller,
    state: SweepState | None = None,
    name: str | None = None,
    tenant: Annotated[str | None, Query(description="admins only: one tenant's sweeps")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SweepList:
    """The caller's sweeps, newest first; an admin sees every tenant's (or one, with
    ``tenant``)."""
    if not caller.admin:
        tenant = caller.tenant
    records = [
        r
        for r in await gw.sweeps.all()
        if (tenant is None or r.tenant == tenant)
        and (state is None or r.state == state)
        and (name is None or r.spec.name == name)
    ]
    records.sort(key=lambda r: (r.created_at.isoformat(), r.sweep_id), reverse=True)
    return SweepList(data=records[:limit])


@router.get("/{sweep_id}", response_model=SweepDetail)
async def get_sweep(sweep_id: str, gw: GW, caller: Caller) -> SweepDetail:
    """The sweep and its trials (parameters, job, state, evaluations, final metric)."""
    record = await _own_sweep(gw, caller, sweep_id)
    trials = sorted(await gw.trials.all(f"{sweep_id}.*"), key=lambda t: t.trial)
    return SweepDetail(**record.model_dump(), trials=trials)


@router.post("/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=SweepRecord)
async def cancel_sweep(
    sweep_id: str,
    gw: GW,
    caller: Caller,
    reason: Annotated[str | None, Query(max_length=500)] = None,
) -> SweepRecord:
    """Stop starting trials and cancel every trial in flight; the sweep ends ``cancelled``."""
    record = await _own_sweep(gw, caller, sweep_id)
    request = SweepCancelRequest(sweep_id=sweep_id, reason=reason or "cancelled by request")
    event = envelope("gateway", "swarm.sweep.cancel", request, subject=sweep_id)
    await gw.publish(
        gw.subjects.sweep_cancel(sweep_id),
        event.model_dump_json().encode(),
        stream=gw.subjects.sweeps_stream,
        headers={"content-type": "application/json"},
    )
    return record


@router.get(
    "/{sweep_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def sweep_events(
    sweep_id: str,
    request: Request,
    gw: GW,
    caller: Caller,
    last_event_id: LastEventId = "",
) -> EventSourceResponse:
    """Replays the sweep's events (SSE id = stream sequence), then follows until it ends;
    ``Last-Event-ID`` resumes after that event, as for jobs."""
    await _own_sweep(gw, caller, sweep_id)

    async def ends(name: str, _: bytes) -> bool:
        return name in SWEEP_TERMINAL_EVENTS

    async def over() -> bool:
        found = await gw.sweeps.get(sweep_id)
        return found is not None and found[0].state.terminal

    events = follow(
        gw,
        gw.subjects.sweep_event(sweep_id, "*"),
        gw.subjects.sweep_events_stream,
        start_sequence(last_event_id),
        request,
        ends=ends,
        over=over,
    )
    return EventSourceResponse(events, ping=10)

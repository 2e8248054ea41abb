"""OpenAI's fine-tuning jobs API as a view of Swarm's jobs: ``/v1/fine_tuning/jobs``.

Create, list (cursor ``after``/``limit``, ``metadata[k]=v`` filter), retrieve, cancel,
pause, resume, events and checkpoints, with the stock ``openai`` client's types. A
fine-tuning job *is* a Swarm job (``ftjob-<hex>`` is ``job-<hex>``): it is queued, placed,
trained, paused, resumed, cancelled and verified like any other, and every Swarm job of the
tenant is listed here too. What OpenAI has and Swarm's spec does not (metadata, suffix, the
hyperparameters in OpenAI's terms) is kept in the gateway's ``openai_jobs`` bucket
(``swarm_gateway.fine_tune_records``). docs/openai.md has the mapping.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel

from swarm_contracts.datasets import method_takes
from swarm_contracts.envelope import envelope
from swarm_contracts.events import CancelRequest, PauseRequest, ResumeRequest
from swarm_contracts.jobs import JobRecord, job_id_for, unpausable, unresumable
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetAdapter, GetModel
from swarm_contracts.registry_api import GET_ADAPTER, GET_MODEL
from swarm_gateway.auth import Caller, Principal, Tenant
from swarm_gateway.fine_tune_records import FineTune, ftjob_id, job_id
from swarm_gateway.fine_tuning_events import (
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    checkpoints,
    event_sequence,
    openai_event,
    stored_events,
    trained_tokens,
)
from swarm_gateway.fine_tuning_spec import (
    FineTuningJobCreate,
    build_spec,
    check_metadata,
    requested_method,
    resolve_beta,
    resolve_hyperparameters,
)
from swarm_gateway.fine_tuning_view import FineTuningJob, view
from swarm_gateway.job_submit import submit
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.routes.openai_files import own_dataset
from swarm_gateway.state import Gateway, get_gateway
from swarm_runtime.records import Conflict
from swarm_runtime.rpc import Refused

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai"])
GW = Annotated[Gateway, Depends(get_gateway)]
DEFAULT_PAGE, MAX_PAGE = 20, 1000
# Tokens trained by finished jobs (their history no longer changes): (job, attempt) -> tokens.
_TOKENS: dict[tuple[str, int], int | None] = {}
_TOKENS_KEPT = 4096


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobCheckpoint]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


def job_not_found(ftjob: str) -> OpenAIError:
    return OpenAIError(
        404, f"Fine-tuning job {ftjob} not found", param="fine_tuning_job_id", code="not_found"
    )


async def _extras(gw: Gateway, job: str) -> FineTune | None:
    if gw.fine_tunes is None:
        return None
    found = await gw.fine_tunes.get(job)
    return found[0] if found is not None else None


async def _own(gw: Gateway, caller: Principal, ftjob: str) -> tuple[JobRecord, FineTune | None]:
    """The job and its OpenAI record; a job the scheduler has not recorded yet is its spec as
    queued. Another tenant's job is as missing as an unknown one (404)."""
    job = job_id(ftjob)
    if job is None:
        raise job_not_found(ftjob)
    found = await gw.jobs.get(job)
    extras = await _extras(gw, job)
    if found is not None:
        record = found[0]
    elif extras is not None:
        record = JobRecord(
            job_id=job,
            tenant=extras.tenant,
            spec=extras.spec,
            created_at=extras.created_at,
        )
    else:
        raise job_not_found(ftjob)
    if not (caller.admin or record.tenant == caller.tenant) or record.verify is not None:
        raise job_not_found(ftjob)
    return record, extras


async def _view(
    gw: Gateway, record: JobRecord, extras: FineTune | None, *, pending: bool = False
) -> FineTuningJob:
    examples = None
    if extras is None:
        found = await gw.datasets.get(f"{record.tenant}.{record.spec.dataset}")
        examples = found[0].examples if found is not None else None
    tokens = None
    if record.state.terminal and record.attempt > 0:
        key = (record.job_id, record.attempt)
        if key not in _TOKENS:
            if len(_TOKENS) >= _TOKENS_KEPT:
                _TOKENS.pop(next(iter(_TOKENS)))
            _TOKENS[key] = trained_tokens(await stored_events(gw, record.job_id))
        tokens = _TOKENS[key]
    return view(record, extras, examples=examples, trained_tokens=tokens, pending=pending)


async def _base_model(gw: Gateway, model: str, tenant: str) -> tuple[str, str | None]:
    """``model`` as a Swarm base model ``name@version``, and the adapter to continue from
    when ``model`` is one of the tenant's adapters (OpenAI fine-tunes a fine-tuned model so)."""
    unknown = OpenAIError(
        400,
        f"Model {model} is not available for fine-tuning or does not exist: see GET /v1/models",
        param="model",
        code="model_not_available",
    )
    try:
        ref = Ref.parse(model)
    except ValueError:
        raise unknown from None
    try:
        if ref.alias is None:
            request = GetModel(name=ref.name, version=ref.version)
            base = await gw.registry.call(GET_MODEL, request)
            return f"{base.name}@{base.version}", None
    except Refused as exc:
        if exc.code != "not_found":
            raise
    try:
        get = GetAdapter(name=model, tenant=tenant)
        adapter = await gw.registry.call(GET_ADAPTER, get)
    except Refused as exc:
        if exc.code in ("not_found", "invalid"):
            raise unknown from exc
        raise
    lineage = adapter.lineage
    return (
        f"{lineage.base_model}@{lineage.base_model_version}",
        f"{adapter.name}@{adapter.version}",
    )


async def _file(gw: Gateway, tenant: str, file: str, param: str, method: str) -> Any:
    """The tenant's dataset behind ``file``, in a format the method trains on."""
    info = await own_dataset(gw, tenant, file)
    if info is None:
        raise OpenAIError(
            400,
            f"{param} {file!r}: no such file; upload it with POST /v1/files (purpose='fine-tune')",
            param=param,
            code="invalid_file",
        )
    if not method_takes("dpo" if method == "dpo" else "sft", info.format):
        need = (
            "a dpo job needs preference pairs, one per line: "
            '{"input": {"messages": [...]}, "preferred_output": [...], '
            '"non_preferred_output": [...]} (or {"prompt", "chosen", "rejected"})'
            if method == "dpo"
            else "preference pairs train with method {'type': 'dpo'}"
        )
        raise OpenAIError(
            400,
            f"{param} {file!r} holds {info.format} examples: {need}",
            param=param,
            code=f"invalid_{param}",
        )
    return info


@router.post("", response_model=FineTuningJob)
async def create_job(
    body: FineTuningJobCreate,
    gw: GW,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> FineTuningJob:
    """A supervised or DPO fine-tuning job: a Swarm job training a LoRA adapter of ``model``
    on the training file. The same ``Idempotency-Key`` gives the same job."""
    check_metadata(body.metadata)
    method, raw, where = requested_method(body)
    train = await _file(gw, tenant, body.training_file, "training_file", method)
    validation = (
        await _file(gw, tenant, body.validation_file, "validation_file", method)
        if body.validation_file
        else None
    )
    hyper = resolve_hyperparameters(raw, where, train.examples, method)
    beta = resolve_beta(raw, where) if method == "dpo" else None
    base_model, parent = await _base_model(gw, body.model, tenant)
    job = job_id_for(tenant, idempotency_key or uuid.uuid4().hex)
    spec, hyper, _ = build_spec(
        body,
        job_id=job,
        base_model=base_model,
        from_adapter=parent,
        dataset=train.id,
        validation=validation.id if validation else None,
        examples=train.examples,
        hyper=hyper,
        beta=beta,
    )
    extras = FineTune(
        job_id=job,
        tenant=tenant,
        model=body.model,
        suffix=body.suffix,
        metadata=body.metadata,
        hyperparameters=hyper,
        spec=spec,
    )
    if gw.fine_tunes is not None:
        try:
            # First, so that the job is never listed without what OpenAI's view needs.
            await gw.fine_tunes.create(job, extras)
        except Conflict:
            existing = await _extras(gw, job)
            extras = existing or extras
            spec = extras.spec
    record, status_code = await submit(gw, tenant, spec, job)
    return await _view(gw, record, extras, pending=status_code == 202)


def _metadata_filter(request: Request) -> tuple[bool, dict[str, str]]:
    """(only jobs without metadata, the ``metadata[k]=v`` pairs asked for)."""
    wanted: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        if key.startswith("metadata[") and key.endswith("]"):
            wanted[key[len("metadata[") : -1]] = value
    return request.query_params.get("metadata") == "null", wanted


@router.get("", response_model=JobList)
async def list_jobs(
    request: Request,
    gw: GW,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> JobList:
    """The caller's jobs, newest first (an admin's: every tenant's). ``after``: the last id
    of the previous page. ``metadata[k]=v`` keeps the jobs with that metadata;
    ``metadata=null`` those without."""
    without, wanted = _metadata_filter(request)
    extras = {f.job_id: f for f in (await gw.fine_tune_list.all() if gw.fine_tune_list else [])}
    records = [
        r
        for r in await gw.all_jobs()
        if (caller.admin or r.tenant == caller.tenant) and r.verify is None
    ]
    recorded = {r.job_id for r in records}
    pending = [
        JobRecord(job_id=f.job_id, tenant=f.tenant, spec=f.spec, created_at=f.created_at)
        for f in extras.values()
        if f.job_id not in recorded and (caller.admin or f.tenant == caller.tenant)
    ]

    def kept(record: JobRecord) -> bool:
        extra = extras.get(record.job_id)
        metadata = extra.metadata if extra is not None else None
        if without:
            return not metadata
        return all((metadata or {}).get(k) == v for k, v in wanted.items())

    jobs = [r for r in [*records, *pending] if kept(r)]
    jobs.sort(key=lambda r: (r.created_at.isoformat(), r.job_id), reverse=True)
    if after is not None:
        ids = [ftjob_id(r.job_id) for r in jobs]
        wanted_id = ftjob_id(job_id(after) or after)
        jobs = jobs[ids.index(wanted_id) + 1 :] if wanted_id in ids else []
    page = jobs[:limit]
    data = [
        await _view(gw, r, extras.get(r.job_id), pending=r.job_id not in recorded) for r in page
    ]
    return JobList(data=data, has_more=len(jobs) > limit)


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJob)
async def retrieve_job(fine_tuning_job_id: str, gw: GW, caller: Caller) -> FineTuningJob:
    record, extras = await _own(gw, caller, fine_tuning_job_id)
    pending = await gw.jobs.get(record.job_id) is None
    return await _view(gw, record, extras, pending=pending)


@router.post("/{fine_tuning_job_id}/cancel", response_model=FineTuningJob)
async def cancel_job(fine_tuning_job_id: str, gw: GW, caller: Caller) -> FineTuningJob:
    """Ask the scheduler to cancel the job: its status is ``cancelled`` once the worker has
    stopped (at once for a queued job). A job that has ended is a 409."""
    record, extras = await _own(gw, caller, fine_tuning_job_id)
    if record.state.terminal:
        raise OpenAIError(
            409,
            f"Job {fine_tuning_job_id} has already {record.state.value}: nothing to cancel",
            param="fine_tuning_job_id",
            code="job_not_cancellable",
        )
    request = CancelRequest(job_id=record.job_id, reason="cancelled by request (OpenAI API)")
    await _control(
        gw, gw.subjects.cancel(record.job_id), "swarm.job.cancel", request, record.job_id
    )
    return await _current(gw, record, extras)


@router.post("/{fine_tuning_job_id}/pause", response_model=FineTuningJob)
async def pause_job(fine_tuning_job_id: str, gw: GW, caller: Caller) -> FineTuningJob:
    """Pause a running job: its worker commits a checkpoint of the step it reached and hands
    the job back; its status is ``paused`` once it has (seconds), with no worker held, until
    it is resumed. A job that is not running (queued, paused, ended) is a 409."""
    record, extras = await _own(gw, caller, fine_tuning_job_id)
    if (problem := unpausable(record)) is not None:
        raise OpenAIError(409, problem, param="fine_tuning_job_id", code="job_not_pausable")
    request = PauseRequest(job_id=record.job_id, reason="paused by request (OpenAI API)")
    await _control(gw, gw.subjects.pause(record.job_id), "swarm.job.pause", request, record.job_id)
    return await _current(gw, record, extras)


@router.post("/{fine_tuning_job_id}/resume", response_model=FineTuningJob)
async def resume_job(fine_tuning_job_id: str, gw: GW, caller: Caller) -> FineTuningJob:
    """Resume a paused job: it is queued again and its next attempt trains on from the
    checkpoint it was paused at. A job that is not paused is a 409."""
    record, extras = await _own(gw, caller, fine_tuning_job_id)
    if (problem := unresumable(record)) is not None:
        raise OpenAIError(409, problem, param="fine_tuning_job_id", code="job_not_resumable")
    request = ResumeRequest(job_id=record.job_id, reason="resumed by request (OpenAI API)")
    await _control(
        gw, gw.subjects.resume(record.job_id), "swarm.job.resume", request, record.job_id
    )
    return await _current(gw, record, extras)


async def _control(gw: Gateway, subject: str, kind: str, data: BaseModel, job: str) -> None:
    """A command about one job for the scheduler, on the control stream (kept until read)."""
    event = envelope("gateway", kind, data, subject=job)
    await gw.publish(
        subject,
        event.model_dump_json().encode(),
        stream=gw.subjects.control_stream,
        headers={"content-type": "application/json"},
    )


async def _current(gw: Gateway, record: JobRecord, extras: FineTune | None) -> FineTuningJob:
    """The job as its record says now (the scheduler may already have acted)."""
    found = await gw.jobs.get(record.job_id)
    return await _view(gw, found[0] if found else record, extras, pending=found is None)


@router.get("/{fine_tuning_job_id}/events", response_model=EventList)
async def list_events(
    fine_tuning_job_id: str,
    gw: GW,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> EventList:
    """The job's events, newest first; ``after``: the last id of the previous page (the
    stock client's ``list_events`` iterates every page)."""
    record, _ = await _own(gw, caller, fine_tuning_job_id)
    events = [openai_event(e) for e in reversed(await stored_events(gw, record.job_id))]
    if after is not None:
        before = event_sequence(after)
        if before is None:
            raise OpenAIError(400, f"after {after!r} is no event id", param="after")
        events = [e for e in events if (event_sequence(e.id) or 0) < before]
    return EventList(data=events[:limit], has_more=len(events) > limit)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=CheckpointList)
async def list_checkpoints(
    fine_tuning_job_id: str,
    gw: GW,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 10,
) -> CheckpointList:
    """The job's committed checkpoints that are kept, newest first, with their metrics."""
    record, _ = await _own(gw, caller, fine_tuning_job_id)
    events = await stored_events(gw, record.job_id) if record.checkpoints else []
    found = checkpoints(record, events, ftjob_id(record.job_id))
    if after is not None:
        ids = [c.id for c in found]
        found = found[ids.index(after) + 1 :] if after in ids else []
    page = found[:limit]
    return CheckpointList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(found) > limit,
    )

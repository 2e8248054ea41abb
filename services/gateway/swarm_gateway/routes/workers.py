"""``/v1/workers``: the scheduler's worker table, read from the ``workers`` bucket, and the
operators' cordons and drains, written to the ``worker_ops`` bucket (the scheduler follows it),
where the scheduler also marks the workers a verification caught (suspect) until cleared;
a worker's self-benchmark, rerun on request; ``/v1/inference/workers``: the inference workers'
latest heartbeats."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, status
from pydantic import BaseModel, Field, StrictBool

from swarm_contracts.inference import InferenceHeartbeat
from swarm_contracts.jobs import utcnow
from swarm_contracts.workers import (
    BENCHMARK,
    BenchmarkRequest,
    WorkerBenchmark,
    WorkerInfo,
    WorkerOps,
)
from swarm_gateway.auth import Admin
from swarm_gateway.state import Gateway, get_gateway
from swarm_runtime.records import Conflict
from swarm_runtime.rpc import ServiceClient

# A worker with a GPU measures in a child process: its imports and CUDA start-up come first.
BENCHMARK_TIMEOUT_S = 180.0

router = APIRouter(prefix="/v1/workers", tags=["workers"])
GW = Annotated[Gateway, Depends(get_gateway)]


class WorkerList(BaseModel):
    data: list[WorkerInfo]


@router.get("", response_model=WorkerList, responses={403: {"description": "not an admin key"}})
async def list_workers(gw: GW, _admin: Admin) -> WorkerList:
    """Admins only: the worker table shows every tenant's running jobs and the providers."""
    workers = await gw.workers.all()
    # The operators' latest word, which the scheduler's entry shows only from the worker's
    # next heartbeat on.
    ops = {o.worker_id: o for o in await gw.worker_ops.all()}
    for w in workers:
        o = ops.get(w.worker_id)
        w.cordoned = o is not None and not o.schedulable
        w.draining = o is not None and o.drain
        w.suspect = o is not None and o.suspect
    workers.sort(key=lambda w: w.worker_id)
    return WorkerList(data=workers)


WorkerId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
ADMIN_ONLY: dict[int | str, dict[str, Any]] = {
    403: {"description": "not an admin key"},
    404: {"description": "unknown worker"},
}


class CordonRequest(BaseModel):
    reason: str = Field(default="", max_length=500)


class DrainRequest(BaseModel):
    # Strict: the document says boolean, so 0 or "yes" must not pass as one.
    move_jobs: StrictBool = Field(
        default=False,
        description="checkpoint the worker's running jobs and move them to other workers now, "
        "instead of letting them finish there",
    )
    reason: str = Field(default="", max_length=500)


async def _set_ops(gw: Gateway, worker_id: str, ops: WorkerOps) -> WorkerOps:
    """Write the operator's instruction; a suspicion the scheduler raised stays (``clear``
    ends it), so the write is a compare-and-set that carries it over."""
    if await gw.workers.get(worker_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"worker {worker_id} not found")

    def keeping_suspicion(old: WorkerOps) -> WorkerOps:
        return ops.model_copy(update={"suspect": old.suspect, "suspect_reason": old.suspect_reason})

    for _ in range(2):  # created meanwhile: the second round finds it
        if (written := await gw.worker_ops.modify(worker_id, keeping_suspicion)) is not None:
            return written[0]
        with contextlib.suppress(Conflict):
            await gw.worker_ops.create(worker_id, ops)
            return ops
    raise HTTPException(status.HTTP_409_CONFLICT, detail=f"worker {worker_id}: try again")


@router.post("/{worker_id}/cordon", response_model=WorkerOps, responses=ADMIN_ONLY)
async def cordon(
    gw: GW, _admin: Admin, worker_id: WorkerId, body: Annotated[CordonRequest | None, Body()] = None
) -> WorkerOps:
    """Admins only: place no new jobs on the worker; its running jobs go on. Kept in the
    ``worker_ops`` bucket, so it outlives scheduler restarts until ``uncordon``."""
    reason = body.reason if body else ""
    ops = WorkerOps(worker_id=worker_id, cordoned=True, reason=reason, updated_at=utcnow())
    return await _set_ops(gw, worker_id, ops)


async def _lift(gw: Gateway, worker_id: str, keep_suspect: bool) -> WorkerOps:
    """End the operator's cordon or drain (``keep_suspect``), or the suspicion a failed
    verification raised (not ``keep_suspect``): what is left stays, by compare-and-set so that
    the scheduler's marking of the worker meanwhile is not lost."""
    if await gw.workers.get(worker_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"worker {worker_id} not found")

    def lift(ops: WorkerOps) -> WorkerOps:
        if keep_suspect:
            ops.cordoned = ops.drain = ops.move_jobs = False
            ops.reason = ""
        else:
            ops.suspect, ops.suspect_reason = False, ""
        ops.updated_at = utcnow()
        return ops

    written = await gw.worker_ops.modify(worker_id, lift)
    if written is None:  # no instruction: nothing to lift
        return WorkerOps(worker_id=worker_id, updated_at=utcnow())
    ops, revision = written
    if ops.schedulable:
        # Nothing left to follow: the entry goes, unless it changed again meanwhile.
        with contextlib.suppress(Conflict):
            await gw.worker_ops.delete(worker_id, revision)
    return ops


@router.post("/{worker_id}/uncordon", response_model=WorkerOps, responses=ADMIN_ONLY)
async def uncordon(gw: GW, _admin: Admin, worker_id: WorkerId) -> WorkerOps:
    """Admins only: the worker takes jobs again (ends a cordon or a drain; a suspect worker
    stays suspect until ``clear``)."""
    return await _lift(gw, worker_id, keep_suspect=True)


@router.post("/{worker_id}/clear", response_model=WorkerOps, responses=ADMIN_ONLY)
async def clear(gw: GW, _admin: Admin, worker_id: WorkerId) -> WorkerOps:
    """Admins only: clear the suspicion a failed verification put on the worker (it takes
    jobs again unless an operator's cordon or drain still holds)."""
    return await _lift(gw, worker_id, keep_suspect=False)


@router.post("/{worker_id}/drain", response_model=WorkerOps, responses=ADMIN_ONLY)
async def drain(
    gw: GW, _admin: Admin, worker_id: WorkerId, body: Annotated[DrainRequest | None, Body()] = None
) -> WorkerOps:
    """Admins only: no new jobs; running jobs finish there, or with ``move_jobs`` are
    checkpointed now and resumed on other workers. ``uncordon`` ends it."""
    body = body or DrainRequest()
    ops = WorkerOps(
        worker_id=worker_id,
        cordoned=True,
        drain=True,
        move_jobs=body.move_jobs,
        reason=body.reason,
        updated_at=utcnow(),
    )
    return await _set_ops(gw, worker_id, ops)


@router.post(
    "/{worker_id}/benchmark",
    response_model=WorkerBenchmark,
    responses={
        **ADMIN_ONLY,
        409: {"description": "the worker's self-benchmark is turned off"},
        503: {"description": "the worker did not answer"},
    },
)
async def benchmark(gw: GW, _admin: Admin, worker_id: WorkerId) -> WorkerBenchmark:
    """Admins only: the worker runs its self-benchmark again now (a few seconds) and answers
    with the result, which its heartbeats carry from then on (``GET /v1/workers`` shows it)."""
    if await gw.workers.get(worker_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"worker {worker_id} not found")
    worker = ServiceClient(gw.nc, "trainer", lambda _: gw.subjects.benchmark(worker_id))
    return await worker.call(
        BENCHMARK,
        BenchmarkRequest(worker_id=worker_id),
        wait_s=BENCHMARK_TIMEOUT_S,
    )


inference_router = APIRouter(prefix="/v1/inference/workers", tags=["workers"])


class InferenceWorkerList(BaseModel):
    data: list[InferenceHeartbeat]


@inference_router.get(
    "", response_model=InferenceWorkerList, responses={403: {"description": "not an admin key"}}
)
async def list_inference_workers(gw: GW, _admin: Admin) -> InferenceWorkerList:
    """Admins only: the inference workers heard from lately (their latest heartbeat), with
    the adapters each has loaded, of every tenant."""
    alive = gw.inference_workers.alive() if gw.inference_workers else []
    return InferenceWorkerList(data=alive)

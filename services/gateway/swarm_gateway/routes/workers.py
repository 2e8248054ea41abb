"""``/v1/workers``: the scheduler's worker table, read from the ``workers`` bucket."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from swarm_common.workers import WorkerInfo
from swarm_gateway.auth import Admin
from swarm_gateway.state import Gateway, get_gateway

router = APIRouter(prefix="/v1/workers", tags=["workers"])
GW = Annotated[Gateway, Depends(get_gateway)]


class WorkerList(BaseModel):
    data: list[WorkerInfo]


@router.get("", response_model=WorkerList, responses={403: {"description": "not an admin key"}})
async def list_workers(gw: GW, _admin: Admin) -> WorkerList:
    """Admins only: the worker table shows every tenant's running jobs and the providers."""
    workers = await gw.workers.all()
    workers.sort(key=lambda w: w.worker_id)
    return WorkerList(data=workers)

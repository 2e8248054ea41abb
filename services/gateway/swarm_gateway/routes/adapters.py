"""``/v1/adapters``: the caller's registered adapters, answered by the registry.

Every request names the caller's tenant to the registry, which answers another tenant's
version as unknown: a 404 here, the same as a version that does not exist.
"""

from __future__ import annotations

import asyncio
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from swarm_common.jobs import MODEL_REF_PATTERN, NAME_PATTERN
from swarm_common.registry import (
    AdapterKey,
    AdapterVersion,
    AliasTarget,
    ExportAdapter,
    ExportResult,
    GetAdapter,
    LineageGraph,
    ListAdapters,
    PromotionRule,
    SetAlias,
)
from swarm_common.store import NotFound, ObjectStore, join_key, sha256_file, validate_key
from swarm_gateway.auth import Tenant
from swarm_gateway.nats_api import call
from swarm_gateway.state import Gateway, get_gateway

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])
GW = Annotated[Gateway, Depends(get_gateway)]
# Names end up in NATS KV keys: reject what could never be one here, with a 422.
AdapterName = Annotated[str, PathParam(pattern=NAME_PATTERN)]
AliasName = Annotated[str, PathParam(pattern=NAME_PATTERN)]
VersionNumber = Annotated[int, PathParam(ge=1)]


class AdapterList(BaseModel):
    data: list[AdapterVersion]


class AliasMove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)


class RuleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(default="eval_loss", min_length=1)
    mode: Literal["min", "max"] = "min"


def _registry(gw: Gateway, action: str) -> str:
    return gw.subjects.registry(action)


@router.get("", response_model=AdapterList)
async def list_adapters(
    gw: GW,
    tenant: Tenant,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    base_model: Annotated[str | None, Query(pattern=MODEL_REF_PATTERN)] = None,
) -> AdapterList:
    request = ListAdapters(name=name, tenant=tenant, base_model=base_model)
    adapters = await call(
        gw, "registry", _registry(gw, "adapters.list"), request, list[AdapterVersion]
    )
    return AdapterList(data=[a for a in adapters if a.tenant == tenant])


async def _get(gw: Gateway, tenant: str, name: str, version: int | None) -> AdapterVersion:
    return await call(
        gw,
        "registry",
        _registry(gw, "adapters.get"),
        GetAdapter(name=name, version=version, tenant=tenant),
        AdapterVersion,
    )


@router.get("/{name}", response_model=AdapterVersion)
async def get_adapter(name: AdapterName, gw: GW, tenant: Tenant) -> AdapterVersion:
    return await _get(gw, tenant, name, None)


@router.get("/{name}/versions/{version}", response_model=AdapterVersion)
async def get_adapter_version(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> AdapterVersion:
    return await _get(gw, tenant, name, version)


@router.delete("/{name}/versions/{version}", response_model=AdapterVersion)
async def delete_adapter_version(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> AdapterVersion:
    """Delete a version's record and files; 409 while an alias points at it."""
    try:
        return await call(
            gw,
            "registry",
            _registry(gw, "adapters.delete"),
            AdapterKey(name=name, version=version, tenant=tenant),
            AdapterVersion,
        )
    except HTTPException as exc:
        if exc.status_code == status.HTTP_422_UNPROCESSABLE_CONTENT and "held by alias" in str(
            exc.detail
        ):
            raise HTTPException(status.HTTP_409_CONFLICT, detail=exc.detail) from exc
        raise


@router.get("/{name}/versions/{version}/lineage", response_model=LineageGraph)
async def get_lineage(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> LineageGraph:
    return await call(
        gw,
        "registry",
        _registry(gw, "adapters.lineage"),
        AdapterKey(name=name, version=version, tenant=tenant),
        LineageGraph,
    )


@router.get("/{name}/aliases/{alias}", response_model=AdapterVersion)
async def get_alias(name: AdapterName, alias: AliasName, gw: GW, tenant: Tenant) -> AdapterVersion:
    return await call(
        gw,
        "registry",
        _registry(gw, "adapters.get"),
        GetAdapter(name=name, alias=alias, tenant=tenant),
        AdapterVersion,
    )


@router.put("/{name}/aliases/{alias}", response_model=AliasTarget)
async def set_alias(
    name: AdapterName, alias: AliasName, body: AliasMove, gw: GW, tenant: Tenant
) -> AliasTarget:
    """Point (or move) an alias at one of the caller's versions, atomically."""
    request = SetAlias(name=name, alias=alias, version=body.version, tenant=tenant)
    return await call(gw, "registry", _registry(gw, "adapters.alias.set"), request, AliasTarget)


@router.put("/{name}/rules/{alias}", response_model=PromotionRule)
async def set_rule(
    name: AdapterName, alias: AliasName, body: RuleBody, gw: GW, tenant: Tenant
) -> PromotionRule:
    """Move ``alias`` to every new version whose ``metric`` beats the current holder's."""
    rule = PromotionRule(name=name, alias=alias, metric=body.metric, mode=body.mode, tenant=tenant)
    return await call(gw, "registry", _registry(gw, "adapters.rule.set"), rule, PromotionRule)


@router.get(
    "/{name}/versions/{version}/download",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/x-tar": {}}, "description": "the PEFT files, as a tar"},
        502: {"description": "a stored file does not match its recorded sha256; nothing sent"},
    },
)
async def download(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> FileResponse:
    """A tar of the version's PEFT files (flat: ``adapter_config.json``, …).

    Each file is copied out of the store and hashed *before* the response starts, and the tar
    is built from those verified copies, so bytes that do not match the recorded sha256 are
    never sent. A mismatch or a missing file is a 502 naming the file: the fault is in the
    store behind the gateway, not in the request.
    """
    record = await _get(gw, tenant, name, version)
    work = Path(tempfile.mkdtemp(prefix="swarm-download-"))
    try:
        bad = await asyncio.to_thread(_fetch_verified, gw.store, record, work)
        if bad:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY,
                detail=f"adapter {name!r} version {version} is corrupted in the store: "
                f"{'; '.join(bad)}; not served",
            )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return FileResponse(
        work / "adapter.tar",
        media_type="application/x-tar",
        filename=f"{name}-v{version}.tar",
        background=BackgroundTask(shutil.rmtree, work, ignore_errors=True),
    )


def _fetch_verified(store: ObjectStore, record: AdapterVersion, work: Path) -> list[str]:
    """Copy and check every file; on success write ``work/adapter.tar``. Returns the problems,
    one per bad file (sync: call it in a thread)."""
    files = work / "files"
    bad = []
    for rel, expected in sorted(record.files.items()):
        local = files / validate_key(rel)
        try:
            store.get_file(join_key(record.store_key, rel), local)
        except NotFound:
            bad.append(f"{rel} is missing")
            continue
        actual = sha256_file(local)
        if actual != expected:
            bad.append(f"{rel} has sha256 {actual}, expected {expected}")
    if not bad:
        with tarfile.open(work / "adapter.tar", "w") as tar:
            for rel in sorted(record.files):
                tar.add(files / rel, arcname=rel, recursive=False)
    return bad


# Merging loads the base model: far slower than a registry lookup.
EXPORT_TIMEOUT_S = 600.0


@router.post("/{name}/versions/{version}/export", response_model=ExportResult)
async def export_adapter(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> ExportResult:
    """Merge the adapter into its base model (``merge_and_unload``), written to the store.

    Done by any trainer agent (they have torch); 503 when none is running.
    """
    return await call(
        gw,
        "trainer",
        gw.subjects.trainer("export"),
        ExportAdapter(name=name, version=version, tenant=tenant),
        ExportResult,
        timeout=EXPORT_TIMEOUT_S,
    )

"""``/v1/adapters``: the caller's registered adapters, answered by the registry.

Every request names the caller's tenant to the registry, which answers another tenant's
version as unknown: a 404 here, the same as a version that does not exist.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarm_contracts.jobs import MODEL_REF_PATTERN, NAME_PATTERN
from swarm_contracts.layout import EXPORT_MANIFEST, export_prefix, join_key
from swarm_contracts.names import METRIC_PATTERN
from swarm_contracts.registry import (
    EXPORT_ADAPTER,
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
from swarm_contracts.registry_api import (
    ADAPTER_LINEAGE,
    DELETE_ADAPTER,
    GET_ADAPTER,
    LIST_ADAPTERS,
    SET_ALIAS,
    SET_RULE,
    UNQUARANTINE_ADAPTER,
)
from swarm_gateway.auth import Admin, Tenant
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.verified_tar import verified_tar

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
    metric: str = Field(default="eval_loss", pattern=METRIC_PATTERN)
    mode: Literal["min", "max"] = "min"
    # A version must also reach it: at least this (max), at most this (min).
    threshold: float | None = Field(default=None, allow_inf_nan=False)


@router.get("", response_model=AdapterList)
async def list_adapters(
    gw: GW,
    tenant: Tenant,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    base_model: Annotated[str | None, Query(pattern=MODEL_REF_PATTERN)] = None,
) -> AdapterList:
    request = ListAdapters(name=name, tenant=tenant, base_model=base_model)
    adapters = await gw.registry.call(LIST_ADAPTERS, request)
    return AdapterList(data=[a for a in adapters if a.tenant == tenant])


async def _get(
    gw: Gateway, tenant: str, name: str, version: int | None, *, shown: bool = False
) -> AdapterVersion:
    """The version (the latest: the newest not quarantined); a quarantined one only to be
    ``shown`` (its ``quarantine`` says why), never downloaded (409)."""
    request = GetAdapter(name=name, version=version, tenant=tenant, include_quarantined=shown)
    return await gw.registry.call(GET_ADAPTER, request)


@router.get("/{name}", response_model=AdapterVersion)
async def get_adapter(name: AdapterName, gw: GW, tenant: Tenant) -> AdapterVersion:
    return await _get(gw, tenant, name, None)


@router.get("/{name}/versions/{version}", response_model=AdapterVersion)
async def get_adapter_version(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> AdapterVersion:
    return await _get(gw, tenant, name, version, shown=True)


@router.post(
    "/{name}/versions/{version}/unquarantine",
    response_model=AdapterVersion,
    responses={403: {"description": "not an admin key"}, 404: {"description": "no such version"}},
)
async def unquarantine(
    name: AdapterName,
    version: VersionNumber,
    gw: GW,
    admin: Admin,
    tenant: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> AdapterVersion:
    """Admins only: release a version from the quarantine a failed verification put it in (of
    ``tenant``, default the admin's own): it may be served, aliased and be the latest again."""
    request = AdapterKey(name=name, version=version, tenant=tenant or admin.tenant)
    return await gw.registry.call(UNQUARANTINE_ADAPTER, request)


@router.delete("/{name}/versions/{version}", response_model=AdapterVersion)
async def delete_adapter_version(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> AdapterVersion:
    """Delete a version's record and files; 409 while an alias points at it."""
    request = AdapterKey(name=name, version=version, tenant=tenant)
    return await gw.registry.call(DELETE_ADAPTER, request)


@router.get("/{name}/versions/{version}/lineage", response_model=LineageGraph)
async def get_lineage(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> LineageGraph:
    request = AdapterKey(name=name, version=version, tenant=tenant)
    return await gw.registry.call(ADAPTER_LINEAGE, request)


@router.get("/{name}/aliases/{alias}", response_model=AdapterVersion)
async def get_alias(name: AdapterName, alias: AliasName, gw: GW, tenant: Tenant) -> AdapterVersion:
    request = GetAdapter(name=name, alias=alias, tenant=tenant)
    return await gw.registry.call(GET_ADAPTER, request)


@router.put("/{name}/aliases/{alias}", response_model=AliasTarget)
async def set_alias(
    name: AdapterName, alias: AliasName, body: AliasMove, gw: GW, tenant: Tenant
) -> AliasTarget:
    """Point (or move) an alias at one of the caller's versions, atomically."""
    request = SetAlias(name=name, alias=alias, version=body.version, tenant=tenant)
    return await gw.registry.call(SET_ALIAS, request)


@router.put("/{name}/rules/{alias}", response_model=PromotionRule)
async def set_rule(
    name: AdapterName, alias: AliasName, body: RuleBody, gw: GW, tenant: Tenant
) -> PromotionRule:
    """Move ``alias`` to every new version whose ``metric`` beats the current holder's (and
    reaches ``threshold``, if given: ``exact_match`` at least 0.9, say)."""
    rule = PromotionRule(
        name=name,
        alias=alias,
        metric=body.metric,
        mode=body.mode,
        tenant=tenant,
        threshold=body.threshold,
    )
    return await gw.registry.call(SET_RULE, rule)


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
    """A tar of the version's PEFT files (flat: ``adapter_config.json``, …), every file
    checked against its sha256 before anything is sent (``swarm_gateway.verified_tar``)."""
    record = await _get(gw, tenant, name, version)
    what = f"adapter {name!r} version {version}"
    return await verified_tar(
        gw.store, record.store_key, record.files, what, f"{name}-v{version}.tar"
    )


# Merging loads the base model: far slower than a registry lookup.
EXPORT_TIMEOUT_S = 600.0


@router.post("/{name}/versions/{version}/export", response_model=ExportResult)
async def export_adapter(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> ExportResult:
    """Merge the adapter into its base model (``merge_and_unload``), written to the store.

    Done by any trainer agent (they have torch); 503 when none is running.
    """
    request = ExportAdapter(name=name, version=version, tenant=tenant)
    return await gw.trainer.call(EXPORT_ADAPTER, request, wait_s=EXPORT_TIMEOUT_S)


@router.get(
    "/{name}/versions/{version}/export/download",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/x-tar": {}}, "description": "the merged model, as a tar"},
        404: {"description": "no such adapter version, or it was not exported yet"},
        502: {"description": "a stored file does not match the export's sha256; nothing sent"},
    },
)
async def download_export(
    name: AdapterName, version: VersionNumber, gw: GW, tenant: Tenant
) -> FileResponse:
    """A tar of the merged model (``from_pretrained`` files) made by ``POST …/export``, each
    file checked against the sha256 the export recorded."""
    record = await _get(gw, tenant, name, version)  # 404 for another tenant's
    key = export_prefix(record.tenant, record.name, record.version)
    manifest_key = join_key(key, EXPORT_MANIFEST)
    if not await asyncio.to_thread(gw.store.exists, manifest_key):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"adapter {name!r} version {version} is not exported: POST its /export first",
        )
    raw = await asyncio.to_thread(gw.store.get_bytes, manifest_key)
    try:
        export = ExportResult.model_validate_json(raw)
    except ValidationError as exc:
        raise HTTPException(
            status.HTTP_502_BAD_GATEWAY, detail=f"the export's manifest is unreadable: {exc}"
        ) from exc
    what = f"the export of adapter {name!r} version {version}"
    return await verified_tar(gw.store, key, export.files, what, f"{name}-v{version}-merged.tar")

"""``/v1/models``: upload a base model (safetensors only) and register it with the registry;
list what the caller can serve.

``GET /v1/models`` is both Swarm's model catalog and OpenAI's model list: an OpenAI list
(``object: "list"``) whose entries are OpenAI model objects (``id``, ``object: "model"``,
``created``, ``owned_by``) carrying Swarm's fields too. ``kind: "base_model"`` entries are
the registry's ``ModelVersion`` records (every field), ``kind: "adapter"`` entries are the
caller's adapters. ``id`` is what to pass as ``model``: the name for the latest version,
``name@version`` for older ones. ``served`` says whether a live inference worker holds the
base model version now. ``?kind=base_model`` lists the catalog alone. ``GET /v1/models/{id}``
(OpenAI's ``models.retrieve``) answers the same entry for any of those ids, and for aliases.
Both reads answer errors in OpenAI's shape (``swarm_gateway.openai_errors``).
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, UploadFile, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from swarm_contracts.jobs import NAME_PATTERN
from swarm_contracts.layout import join_key, model_prefix
from swarm_contracts.names import HF_ID_PATTERN
from swarm_contracts.refs import Ref
from swarm_contracts.registry import (
    AdapterVersion,
    GetAdapter,
    GetModel,
    ListAdapters,
    ListModels,
    ModelVersion,
    RegisterModel,
)
from swarm_contracts.registry_api import (
    GET_ADAPTER,
    GET_MODEL,
    LIST_ADAPTERS,
    LIST_MODELS,
    REGISTER_MODEL,
)
from swarm_gateway.auth import Admin, Tenant
from swarm_gateway.errors import field_error
from swarm_gateway.openai_errors import model_not_found
from swarm_gateway.openapi_doc import OpenAIErrorBody
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.uploads import check_content_length, save_upload
from swarm_gateway.verified_tar import verified_tar
from swarm_runtime.rpc import Refused
from swarm_runtime.store import tree_digest

router = APIRouter(prefix="/v1/models", tags=["models"])
GW = Annotated[Gateway, Depends(get_gateway)]

# Pickle-based weights can run code when loaded: only safetensors weights are accepted.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BaseModelEntry(ModelVersion):
    id: str = Field(description="what to pass as `model`: name (latest) or name@version")
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time of registration")
    owned_by: str = "swarm"
    kind: Literal["base_model"] = "base_model"
    served: bool = Field(description="a live inference worker holds this version")


class AdapterEntry(BaseModel):
    id: str = Field(description="what to pass as `model`: name (latest) or name@version")
    object: Literal["model"] = "model"
    created: int
    owned_by: str = Field(description="the tenant")
    kind: Literal["adapter"] = "adapter"
    name: str
    version: int
    base_model: str = Field(description="name@version it was trained on")
    served: bool = Field(description="a live inference worker holds its base model version")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BaseModelEntry | AdapterEntry]


def _check_file_name(name: str | None, index: int) -> str:
    loc: list[str | int] = ["body", "files", index]
    if not name:
        raise field_error(422, loc, "every file needs a name")
    if "/" in name or "\\" in name or ".." in name or not _SAFE_NAME.match(name):
        raise field_error(422, loc, f"file name {name!r} must be a flat name (no '/', '..')")
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise field_error(
            422, loc, f"{name}: pickle weights are not accepted; convert to .safetensors"
        )
    return name


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelVersion,
    responses={403: {"description": "not an admin key"}},
)
async def add_model(
    request: Request,
    gw: GW,
    # The base-model catalog is shared by every tenant, so only the operator curates it.
    _admin: Admin,
    name: Annotated[str, Form(pattern=NAME_PATTERN, description="registry model name")],
    # At least one in the schema; which files must be there (config.json and weights) is
    # checked below, with a message naming the missing one, and listed as this operation's 422.
    files: Annotated[
        list[UploadFile],
        File(min_length=1, description="config.json, *.safetensors, tokenizer"),
    ],
    hf_id: Annotated[
        str | None,
        Form(
            pattern=HF_ID_PATTERN,
            description="the Hugging Face Hub id these files came from (e.g. "
            "`HuggingFaceTB/SmolLM2-135M`): adapters trained on it name it as their base model",
        ),
    ] = None,
) -> ModelVersion:
    limit = gw.settings.max_upload_bytes
    check_content_length(request, limit)
    names = [_check_file_name(f.filename, i) for i, f in enumerate(files)]
    if len(set(names)) != len(names):
        raise field_error(422, ["body", "files"], "file names must be unique")
    if "config.json" not in names:
        raise field_error(422, ["body", "files"], "config.json is required")
    if not any(n.endswith(".safetensors") for n in names):
        raise field_error(
            422, ["body", "files"], "at least one .safetensors weights file is required"
        )

    with tempfile.TemporaryDirectory(prefix="swarm-model-") as tmp:
        digests: dict[str, str] = {}
        used = 0
        for upload, file_name in zip(files, names, strict=True):
            size, sha = await save_upload(upload, FsPath(tmp) / file_name, limit, used)
            used += size
            digests[file_name] = sha
        # Content-addressed prefix: the same files always land in the same place.
        prefix = model_prefix(name, tree_digest(digests))
        for file_name in names:
            key = join_key(prefix, file_name)
            if not await asyncio.to_thread(gw.store.exists, key):
                await asyncio.to_thread(gw.store.put_file, key, FsPath(tmp) / file_name)

    register = RegisterModel(name=name, store_key=prefix, hf_id=hf_id)
    return await gw.registry.call(REGISTER_MODEL, register)


def _ids(records: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    latest: dict[str, int] = {}
    for name, version in records:
        latest[name] = max(version, latest.get(name, 0))
    return {(n, v): n if latest[n] == v else f"{n}@{v}" for n, v in records}


def _held(gw: Gateway) -> set[tuple[str, int]]:
    """The base model versions a live inference worker holds."""
    return {
        (m.name, m.version)
        for beat in (gw.inference_workers.alive() if gw.inference_workers else [])
        for m in beat.base_models
    }


def _base_entry(m: ModelVersion, model_id: str, held: set[tuple[str, int]]) -> BaseModelEntry:
    return BaseModelEntry(
        **m.model_dump(),
        id=model_id,
        created=int(m.created_at.timestamp()),
        served=(m.name, m.version) in held,
    )


def _adapter_entry(a: AdapterVersion, model_id: str, held: set[tuple[str, int]]) -> AdapterEntry:
    base = (a.lineage.base_model, a.lineage.base_model_version)
    return AdapterEntry(
        id=model_id,
        created=int(a.created_at.timestamp()),
        owned_by=a.tenant,
        name=a.name,
        version=a.version,
        base_model=f"{base[0]}@{base[1]}",
        served=base in held,
    )


# OpenAI's models.list and models.retrieve: their errors are OpenAI's shape.
_OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIErrorBody, "description": why}
    for code, why in (
        (400, "a bad query value"),
        (401, "missing or unknown API key"),
        (403, "the registry refused the caller"),
        (404, "no such model for the caller"),
        (502, "the registry failed"),
        (503, "the registry or NATS is not reachable"),
    )
}


@router.get("", response_model=ModelList, responses=_OPENAI_ERRORS)
async def list_models(
    gw: GW,
    tenant: Tenant,
    kind: Annotated[Literal["base_model", "adapter"] | None, Query()] = None,
) -> ModelList:
    held = _held(gw)
    entries: list[BaseModelEntry | AdapterEntry] = []
    if kind in (None, "base_model"):
        models = await gw.registry.call(LIST_MODELS, ListModels())
        ids = _ids([(m.name, m.version) for m in models])
        for m in sorted(models, key=lambda m: (m.name, -m.version)):
            entries.append(_base_entry(m, ids[(m.name, m.version)], held))
    if kind in (None, "adapter"):
        request = ListAdapters(tenant=tenant)
        adapters = await gw.registry.call(LIST_ADAPTERS, request)
        adapters = [a for a in adapters if a.tenant == tenant]
        ids = _ids([(a.name, a.version) for a in adapters])
        for a in sorted(adapters, key=lambda a: (a.name, -a.version)):
            entries.append(_adapter_entry(a, ids[(a.name, a.version)], held))
    return ModelList(data=entries)


@router.get("/{model_id}", response_model=BaseModelEntry | AdapterEntry, responses=_OPENAI_ERRORS)
async def get_model(
    model_id: Annotated[str, Path(max_length=200)],
    gw: GW,
    tenant: Tenant,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> BaseModelEntry | AdapterEntry:
    """OpenAI's ``models.retrieve``: any id ``GET /v1/models`` lists, and every other name a
    completion takes (``name@version``, an adapter's ``name@alias``), as the same entry.
    ``version`` picks a base model's version (Swarm's own use)."""
    try:
        ref = Ref.parse(model_id)
    except ValueError:
        raise model_not_found(model_id) from None
    if not re.match(NAME_PATTERN, ref.name):
        raise model_not_found(model_id)
    held = _held(gw)
    if ref.alias is None:
        try:
            request = GetModel(name=ref.name, version=version or ref.version)
            model = await gw.registry.call(GET_MODEL, request)
            return _base_entry(model, model_id, held)
        except Refused as exc:
            if exc.code != "not_found":
                raise
    if version is not None and ref.version is None and ref.alias is None:
        model_id = f"{ref.name}@{version}"
    try:
        get = GetAdapter(name=model_id, tenant=tenant)
        adapter = await gw.registry.call(GET_ADAPTER, get)
    except Refused as exc:
        if exc.code in ("not_found", "invalid"):
            raise model_not_found(model_id) from exc
        raise
    return _adapter_entry(adapter, model_id, held)


@router.get(
    "/{name}/versions/{version}/download",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/x-tar": {}}, "description": "the model's files, as a tar"},
        502: {"description": "a stored file does not match its recorded sha256; nothing sent"},
    },
)
async def download_model(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    version: Annotated[int, Path(ge=1)],
    gw: GW,
    _tenant: Tenant,
) -> FileResponse:
    """A tar of the version's ``from_pretrained`` files (flat), every file checked against its
    sha256 before anything is sent: what ``swarm adapters pull NAME --with-base`` puts beside
    an adapter."""
    model = await gw.registry.call(GET_MODEL, GetModel(name=name, version=version))
    what = f"model {name!r} version {version}"
    return await verified_tar(
        gw.store, model.store_key, model.files, what, f"{name}-v{version}.tar"
    )

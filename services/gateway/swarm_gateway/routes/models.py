"""``/v1/models``: upload a base model (safetensors only) and register it with the registry."""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, UploadFile, status
from pydantic import BaseModel

from swarm_common.jobs import NAME_PATTERN
from swarm_common.registry import GetModel, ModelVersion, RegisterModel
from swarm_common.store import join_key, tree_digest
from swarm_gateway.auth import Admin, Tenant
from swarm_gateway.errors import field_error
from swarm_gateway.nats_api import call
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.uploads import check_content_length, save_upload

router = APIRouter(prefix="/v1/models", tags=["models"])
GW = Annotated[Gateway, Depends(get_gateway)]

# Pickle-based weights can run code when loaded: only safetensors weights are accepted.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelList(BaseModel):
    data: list[ModelVersion]


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
    files: Annotated[list[UploadFile], File(description="config.json, *.safetensors, tokenizer")],
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
        prefix = join_key("models", name, tree_digest(digests)[:16])
        for file_name in names:
            key = join_key(prefix, file_name)
            if not await asyncio.to_thread(gw.store.exists, key):
                await asyncio.to_thread(gw.store.put_file, key, FsPath(tmp) / file_name)

    return await call(
        gw,
        "registry",
        gw.subjects.registry("models.register"),
        RegisterModel(name=name, store_key=prefix),
        ModelVersion,
    )


@router.get("", response_model=ModelList)
async def list_models(gw: GW, _tenant: Tenant) -> ModelList:
    models = await call(gw, "registry", gw.subjects.registry("models.list"), {}, list[ModelVersion])
    return ModelList(data=models)


@router.get("/{name}", response_model=ModelVersion)
async def get_model(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    gw: GW,
    _tenant: Tenant,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> ModelVersion:
    return await call(
        gw,
        "registry",
        gw.subjects.registry("models.get"),
        GetModel(name=name, version=version),
        ModelVersion,
    )

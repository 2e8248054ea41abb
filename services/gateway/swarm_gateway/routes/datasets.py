"""``/v1/datasets``: content-addressed JSONL uploads, one per tenant and sha256."""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import (
    APIRouter,
    Depends,
    File,
    Form,
    HTTPException,
    Query,
    Request,
    UploadFile,
    status,
)
from pydantic import BaseModel

from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.jobs import MODEL_REF_PATTERN
from swarm_contracts.layout import join_key
from swarm_contracts.names import check_label, label_from_filename
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetModel, ModelVersion
from swarm_contracts.registry_api import GET_MODEL
from swarm_gateway.auth import Tenant
from swarm_gateway.dataset_stats import (
    DatasetStats,
    measure,
    over_seq_len,
    percentiles,
    stated_error,
)
from swarm_gateway.dataset_upload import start_in_background, store_dataset
from swarm_gateway.dataset_validation import DatasetError
from swarm_gateway.errors import field_error
from swarm_gateway.responses import FiniteJSONResponse
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.uploads import check_content_length
from swarm_runtime.dataset_codec import fetch_jsonl

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
GW = Annotated[Gateway, Depends(get_gateway)]


class DatasetList(BaseModel):
    data: list[DatasetInfo]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetInfo,
    responses={
        200: {"model": DatasetInfo, "description": "the same file was uploaded before"},
        202: {
            "model": DatasetUpload,
            "description": "background: received, being checked (GET /v1/datasets/uploads/{id})",
        },
    },
)
async def upload_dataset(
    request: Request,
    gw: GW,
    tenant: Tenant,
    file: Annotated[UploadFile, File(description="JSONL: text, prompt/completion or chat")],
    name: Annotated[
        str | None, Form(description="a label; default: the file's name without its path")
    ] = None,
    background: Annotated[
        bool,
        Query(description="answer once the file is received, and check it in the background"),
    ] = False,
) -> FiniteJSONResponse:
    check_content_length(request, gw.settings.max_upload_bytes)
    label = _label(name, file.filename)
    if background:
        upload = await start_in_background(gw, tenant, file, label)
        return FiniteJSONResponse(
            upload.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED
        )
    try:
        info, new = await store_dataset(gw, tenant, file, label)
    except DatasetError as exc:
        loc: list[str | int] = ["body", "file"]
        if exc.line:
            loc.append(f"line {exc.line}")
        raise field_error(422, loc, str(exc), "invalid_dataset") from exc
    return FiniteJSONResponse(
        info.model_dump(mode="json"),
        status_code=status.HTTP_201_CREATED if new else status.HTTP_200_OK,
    )


def _label(name: str | None, filename: str | None) -> str | None:
    """The dataset's label: ``name`` as given, else the uploaded file's base name (names are
    labels, not paths: ``swarm_contracts.names``)."""
    try:
        if name is not None:
            return check_label(name, "name")
        return label_from_filename(filename) if filename else None
    except ValueError as exc:
        loc: list[str | int] = ["body", "name" if name is not None else "file"]
        raise field_error(422, loc, str(exc), "invalid_name") from exc


@router.get("", response_model=DatasetList)
async def list_datasets(gw: GW, tenant: Tenant) -> DatasetList:
    prefix = f"{tenant}."
    found = []
    for key in await gw.datasets.keys():
        if key.startswith(prefix):
            got = await gw.datasets.get(key)
            if got is not None:
                found.append(got[0])
    found.sort(key=lambda d: d.created_at, reverse=True)
    return DatasetList(data=found)


async def _own_dataset(gw: Gateway, tenant: str, dataset_id: str) -> DatasetInfo:
    found = (
        await gw.datasets.get(f"{tenant}.{dataset_id}") if dataset_id.startswith("ds-") else None
    )
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"dataset {dataset_id} not found")
    return found[0]


@router.get("/uploads/{upload_id}", response_model=DatasetUpload)
async def get_upload(upload_id: str, gw: GW, tenant: Tenant) -> DatasetUpload:
    """A background upload: its progress, then the dataset or the bad lines."""
    assert gw.dataset_uploads is not None
    valid = re.fullmatch(r"dsu-[0-9a-f]{24}", upload_id) is not None
    found = await gw.dataset_uploads.get(f"{tenant}.{upload_id}") if valid else None
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no upload {upload_id}")
    return found[0]


@router.get("/{dataset_id}", response_model=DatasetInfo)
async def get_dataset(dataset_id: str, gw: GW, tenant: Tenant) -> DatasetInfo:
    return await _own_dataset(gw, tenant, dataset_id)


# Tokenizers by model digest: the same files always give the same tokenizer, and loading one
# is the slow part of a stats request. Bounded, since every model version could be asked for.
_tokenizers: dict[str, Any] = {}
_MAX_TOKENIZERS = 8


async def _tokenizer_for(gw: Gateway, model: ModelVersion) -> Any | None:
    if "tokenizer.json" not in model.files:
        return None
    if model.digest not in _tokenizers:
        from tokenizers import Tokenizer  # Rust tokenizers only: no torch in the gateway

        raw = await asyncio.to_thread(
            gw.store.get_bytes, join_key(model.store_key, "tokenizer.json")
        )
        try:
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # a broken tokenizer.json is the model's fault, not ours
            raise field_error(
                422, ["query", "model"], f"cannot load {model.name}'s tokenizer.json: {exc}"
            ) from exc
        if len(_tokenizers) >= _MAX_TOKENIZERS:
            _tokenizers.pop(next(iter(_tokenizers)))
        _tokenizers[model.digest] = tokenizer
    return _tokenizers[model.digest]


@router.get("/{dataset_id}/stats", response_model=DatasetStats)
async def dataset_stats(
    dataset_id: str,
    gw: GW,
    tenant: Tenant,
    model: Annotated[
        str | None,
        Query(pattern=MODEL_REF_PATTERN, description="registry model name[@version]"),
    ] = None,
) -> DatasetStats:
    """Examples and length percentiles; token lengths with ``model``'s tokenizer."""
    info = await _own_dataset(gw, tenant, dataset_id)
    version: ModelVersion | None = None
    tokenizer = None
    if model:
        ref = Ref.parse_versioned(model)  # the query pattern admits only name[@version]
        request = GetModel(name=ref.name, version=ref.version)
        version = await gw.registry.call(GET_MODEL, request)
        tokenizer = await _tokenizer_for(gw, version)
    with tempfile.TemporaryDirectory(prefix="swarm-stats-") as tmp:
        path = Path(tmp) / "data.jsonl"
        await asyncio.to_thread(fetch_jsonl, gw.store, info.store_key, path)
        measured = await asyncio.to_thread(measure, path, tokenizer)
    chars = percentiles(measured.chars)
    # Exact whatever was sampled: a sample's mean and max would only estimate them.
    chars.mean, chars.max = measured.chars_mean, float(measured.chars_max)
    stats = DatasetStats(
        dataset=info.id,
        format=info.format,
        examples=info.examples,
        bytes=info.bytes,
        chars=chars,
    )
    if measured.sampled:
        stats.sampled = len(measured.chars)
        stats.error = stated_error(measured.examples, len(measured.chars))
    if version is not None:
        stats.model = f"{version.name}@{version.version}"
        stats.tokens = percentiles(measured.tokens)
        stats.token_method = "tokenizer.json" if tokenizer else "approximate (chars/4)"
        stats.over_seq_len = over_seq_len(measured.tokens, measured.examples)
    return stats

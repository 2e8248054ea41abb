"""OpenAI's Files API over Swarm's datasets: ``POST/GET /v1/files``, ``GET/DELETE
/v1/files/{id}``, ``GET /v1/files/{id}/content``.

A ``fine-tune`` file is a dataset of the caller's tenant (``file-<hex>`` is ``ds-<hex>``),
checked line by line on upload as ``POST /v1/datasets`` checks it: a file that is no dataset
is a 400 naming the line. A fine-tuning job's metrics CSV (its ``result_files``) is a
``fine-tune-results`` file, made from the job's metrics when read. Errors are OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import csv
import io
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel
from starlette.background import BackgroundTask

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import JobRecord
from swarm_contracts.metrics import GET_JOB_METRICS, GetJobMetrics, JobMetrics
from swarm_contracts.names import label_from_filename
from swarm_gateway.auth import Tenant
from swarm_gateway.dataset_upload import store_dataset
from swarm_gateway.dataset_validation import DatasetError
from swarm_gateway.fine_tune_records import (
    dataset_id,
    file_id,
    results_file_id,
    results_job_id,
)
from swarm_gateway.openai_errors import OpenAIError
from swarm_gateway.state import Gateway, get_gateway
from swarm_gateway.uploads import check_content_length
from swarm_runtime.dataset_codec import fetch_jsonl

router = APIRouter(prefix="/v1/files", tags=["openai"])
GW = Annotated[Gateway, Depends(get_gateway)]

Purpose = Literal["fine-tune", "fine-tune-results"]
RESULTS_FILENAME = "step_metrics.csv"


class FileObject(BaseModel):
    """OpenAI's ``file`` object (``openai.types.FileObject``)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Purpose
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def file_object(info: DatasetInfo) -> FileObject:
    return FileObject(
        id=file_id(info.id),
        bytes=info.bytes,
        created_at=int(info.created_at.timestamp()),
        filename=info.name or f"{info.id}.jsonl",
        purpose="fine-tune",
    )


def file_not_found(file: str) -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file}", param="id", code="file_not_found")


async def own_dataset(gw: Gateway, tenant: str, file: str) -> DatasetInfo | None:
    """The tenant's dataset that ``file`` names (None: none of theirs)."""
    ds = dataset_id(file)
    if ds is None:
        return None
    found = await gw.datasets.get(f"{tenant}.{ds}")
    return found[0] if found is not None else None


@router.post("", response_model=FileObject)
async def create_file(
    request: Request,
    gw: GW,
    tenant: Tenant,
    file: Annotated[UploadFile, File(description="JSONL: chat, prompt/completion or text")],
    purpose: Annotated[str, Form(description='only "fine-tune"')],
) -> FileObject:
    """Upload a training or validation file; the same bytes uploaded again give the same
    file."""
    if purpose != "fine-tune":
        raise OpenAIError(
            400,
            f"purpose {purpose!r} is not supported: Swarm keeps fine-tuning files only "
            "(purpose='fine-tune')",
            param="purpose",
            code="unsupported_purpose",
        )
    check_content_length(request, gw.settings.max_upload_bytes)
    try:
        label = label_from_filename(file.filename) if file.filename else None
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="file", code="invalid_file_name") from exc
    try:
        info, _ = await store_dataset(gw, tenant, file, label)
    except DatasetError as exc:
        raise OpenAIError(
            400, f"invalid training file: {exc}", param="file", code="invalid_file_format"
        ) from exc
    return file_object(info)


@router.get("", response_model=FileList)
async def list_files(
    gw: GW,
    tenant: Tenant,
    purpose: str | None = None,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> FileList:
    """The tenant's fine-tuning files, newest first (``order=asc``: oldest first). Result
    files are not listed: a job's ``result_files`` names its own."""
    found: list[DatasetInfo] = []
    if purpose in (None, "fine-tune"):
        prefix = f"{tenant}."
        for key in await gw.datasets.keys():
            if key.startswith(prefix) and (got := await gw.datasets.get(key)) is not None:
                found.append(got[0])
    found.sort(key=lambda d: (d.created_at, d.id), reverse=order == "desc")
    files = [file_object(d) for d in found]
    if after is not None:
        ids = [f.id for f in files]
        files = files[ids.index(after) + 1 :] if after in ids else []
    page = files[:limit]
    return FileList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(files) > limit,
    )


async def _results(gw: Gateway, tenant: str, file: str) -> tuple[JobRecord, bytes] | None:
    """The job a result file is of, and its metrics as OpenAI's results CSV; None when
    ``file`` is no result file of the tenant's."""
    job = results_job_id(file)
    found = await gw.jobs.get(job) if job is not None else None
    if found is None or found[0].tenant != tenant:
        return None
    request = GetJobMetrics(job_id=found[0].job_id)
    metrics = await gw.telemetry.call(GET_JOB_METRICS, request)
    return found[0], results_csv(metrics)


def results_csv(metrics: JobMetrics) -> bytes:
    """``step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy``, one row per
    training step, as OpenAI writes it (accuracies are not measured: empty)."""
    valid = {p.step: p.eval_loss for p in metrics.eval}
    train = {p.step: p.loss for p in metrics.train}  # a resumed attempt's step replaces it
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
    )
    for step in sorted(train):
        writer.writerow([step, train[step], "", valid.get(step, ""), ""])
    return out.getvalue().encode()


@router.get("/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, gw: GW, tenant: Tenant) -> FileObject:
    info = await own_dataset(gw, tenant, file_id)
    if info is not None:
        return file_object(info)
    results = await _results(gw, tenant, file_id)
    if results is None:
        raise file_not_found(file_id)
    record, csv_bytes = results
    return FileObject(
        id=results_file_id(record.job_id),
        bytes=len(csv_bytes),
        created_at=int(record.updated_at.timestamp()),
        filename=RESULTS_FILENAME,
        purpose="fine-tune-results",
    )


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}, "text/csv": {}}}},
)
async def file_content(file_id: str, gw: GW, tenant: Tenant) -> Response:
    """The file's bytes as uploaded (a result file: its CSV)."""
    info = await own_dataset(gw, tenant, file_id)
    if info is None:
        results = await _results(gw, tenant, file_id)
        if results is None:
            raise file_not_found(file_id)
        return Response(results[1], media_type="text/csv")
    tmp = Path(tempfile.mkdtemp(prefix="swarm-file-"))
    path = tmp / "data.jsonl"
    await asyncio.to_thread(fetch_jsonl, gw.store, info.store_key, path)
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=info.name or f"{info.id}.jsonl",
        background=BackgroundTask(_remove, tmp),
    )


def _remove(tmp: Path) -> None:
    for child in tmp.iterdir():
        child.unlink(missing_ok=True)
    tmp.rmdir()


@router.delete("/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, gw: GW, tenant: Tenant) -> FileDeleted:
    """Forget the file: it leaves the listings and no new job can name it. A job still to
    finish that trains or validates on it keeps it (409); the bytes stay in the store, where
    the verification replay of a finished job reads them."""
    info = await own_dataset(gw, tenant, file_id)
    if info is None:
        raise file_not_found(file_id)
    for record in await gw.all_jobs():
        uses = info.id in (record.spec.dataset, record.spec.validation)
        if record.tenant == tenant and uses and not record.state.terminal:
            raise OpenAIError(
                409,
                f"file {file_id} is in use by job {record.job_id} ({record.state.value}); "
                "delete it when the job has ended",
                param="id",
                code="file_in_use",
            )
    await gw.datasets.delete(f"{tenant}.{info.id}")
    return FileDeleted(id=file_id, deleted=True)

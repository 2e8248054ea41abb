"""Storing an uploaded JSONL dataset: checked line by line, content-addressed, one record per
tenant and sha256. Shared by ``POST /v1/datasets`` and OpenAI's ``POST /v1/files``.

An upload may be plain, gzip or zstd JSONL (told by its magic bytes). One streaming pass over
the decompressed lines checks them, hashes them and recompresses them with zstd for the store,
so the gateway never holds the file in memory. The sha256 (and so the dataset id) is of the
decompressed JSONL: the same data uploaded plain or compressed is the same dataset."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException, UploadFile, status

from swarm_contracts.datasets import DatasetInfo, DatasetUpload, dataset_id_for
from swarm_contracts.jobs import utcnow
from swarm_contracts.layout import dataset_key
from swarm_gateway.dataset_validation import DatasetError, DatasetSummary, JsonlChecker
from swarm_gateway.state import Gateway
from swarm_gateway.uploads import save_upload
from swarm_runtime.dataset_codec import CorruptDataset, open_jsonl, zstd_writer
from swarm_runtime.records import Conflict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedDataset:
    summary: DatasetSummary
    sha256: str  # of the decompressed JSONL
    bytes: int  # of the decompressed JSONL


# A background validation reports its progress at most this often.
PROGRESS_EVERY_S = 0.5
# Progress: (bytes of the upload read, lines checked).
Progress = Callable[[int, int], None]


def prepare(upload: Path, stored: Path, progress: Progress | None = None) -> PreparedDataset:
    """Check ``upload`` (plain, gzip or zstd JSONL) and write it zstd-compressed to ``stored``;
    ``progress`` is told how far it got every ``PROGRESS_EVERY_S`` and at the end.

    Raises ``DatasetError`` for bad lines or compressed data that does not decompress."""
    checker = JsonlChecker()
    digest = hashlib.sha256()
    size = number = 0
    told = time.monotonic()
    try:
        with (
            open(upload, "rb") as raw_file,
            open_jsonl(upload, raw_file) as lines,
            open(stored, "wb") as out,
            zstd_writer(out) as packed,
        ):
            for number, raw in enumerate(lines, start=1):
                checker.line(number, raw)
                digest.update(raw)
                size += len(raw)
                packed.write(raw)
                if progress is not None and time.monotonic() - told >= PROGRESS_EVERY_S:
                    progress(raw_file.tell(), number)
                    told = time.monotonic()
    except CorruptDataset as exc:
        raise DatasetError(str(exc)) from exc
    if progress is not None:
        progress(upload.stat().st_size, number)
    return PreparedDataset(checker.summary(), digest.hexdigest(), size)


async def store_dataset(
    gw: Gateway, tenant: str, upload: UploadFile, label: str | None
) -> tuple[DatasetInfo, bool]:
    """The dataset's record, and whether it is new (False: the same bytes were uploaded
    before, and that record is the answer). Raises ``DatasetError`` naming the line of a
    file that is no dataset, and an ``HTTPException`` for one over the size limit."""
    with tempfile.TemporaryDirectory(prefix="swarm-upload-") as tmp:
        path = Path(tmp) / "upload"
        await save_upload(upload, path, gw.settings.max_upload_bytes)
        return await register(gw, tenant, path, label)


async def register(
    gw: Gateway, tenant: str, path: Path, label: str | None, progress: Progress | None = None
) -> tuple[DatasetInfo, bool]:
    """Check the upload at ``path``, store it and record it (``store_dataset``)."""
    stored = path.with_name("data.jsonl.zst")
    prepared = await asyncio.to_thread(prepare, path, stored, progress)
    summary, sha = prepared.summary, prepared.sha256

    dataset_id = dataset_id_for(sha)
    kv_key = f"{tenant}.{dataset_id}"
    existing = await gw.datasets.get(kv_key)
    if existing is not None:
        return existing[0], False

    store_key = dataset_key(tenant, sha)
    # Content-addressed: identical bytes already stored need not travel again.
    if not await asyncio.to_thread(gw.store.exists, store_key):
        await asyncio.to_thread(gw.store.put_file, store_key, stored)

    info = DatasetInfo(
        id=dataset_id,
        tenant=tenant,
        name=label,
        sha256=sha,
        store_key=store_key,
        format=summary.format,
        examples=summary.examples,
        bytes=prepared.bytes,
    )
    try:
        await gw.datasets.create(kv_key, info)
    except Conflict:
        # A concurrent identical upload won the race; its record is the answer.
        found = await gw.datasets.get(kv_key)
        if found is None:
            raise HTTPException(
                status.HTTP_409_CONFLICT, detail="concurrent upload, retry"
            ) from None
        return found[0], False
    return info, True


async def start_in_background(
    gw: Gateway, tenant: str, upload: UploadFile, label: str | None
) -> DatasetUpload:
    """Receive the file, then check and store it in a task of this gateway's: the answer is
    the upload's record, whose progress ``GET /v1/datasets/uploads/{id}`` reads (any gateway:
    it is in the ``dataset_uploads`` bucket)."""
    assert gw.dataset_uploads is not None
    tmp = Path(tempfile.mkdtemp(prefix="swarm-upload-"))
    try:
        path = tmp / "upload"
        size, _ = await save_upload(upload, path, gw.settings.max_upload_bytes)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record = DatasetUpload(
        upload_id=f"dsu-{secrets.token_hex(12)}", tenant=tenant, name=label, bytes_total=size
    )
    key = f"{tenant}.{record.upload_id}"
    await gw.dataset_uploads.put(key, record)
    task = asyncio.create_task(_validate(gw, key, record, path, tmp))
    gw.background.add(task)
    task.add_done_callback(gw.background.discard)
    return record


async def _validate(gw: Gateway, key: str, record: DatasetUpload, path: Path, tmp: Path) -> None:
    uploads = gw.dataset_uploads
    assert uploads is not None
    loop = asyncio.get_running_loop()
    writes: list[concurrent.futures.Future[int]] = []

    def progress(read: int, lines: int) -> None:
        # From the checking thread: the record is written on the event loop, not waited for.
        update = record.model_copy(
            update={"bytes_checked": read, "lines_checked": lines, "updated_at": utcnow()}
        )
        writes.append(asyncio.run_coroutine_threadsafe(uploads.put(key, update), loop))

    try:
        info, _ = await register(gw, record.tenant, path, record.name, progress)
        done = {"state": "ready", "dataset": info, "bytes_checked": record.bytes_total}
    except DatasetError as exc:
        bad = [p.line for p in exc.problems if p.line] or ([exc.line] if exc.line else [])
        done = {"state": "invalid", "error": str(exc), "bad_lines": bad}
    except Exception as exc:
        log.exception("validating upload %s failed", record.upload_id)
        done = {"state": "invalid", "error": f"the upload could not be checked: {exc!r}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Every progress write lands before the outcome, never after it.
    await asyncio.gather(*(asyncio.wrap_future(w) for w in writes), return_exceptions=True)
    found = await uploads.get(key)
    latest = found[0] if found else record
    await uploads.put(key, latest.model_copy(update=done | {"updated_at": utcnow()}))

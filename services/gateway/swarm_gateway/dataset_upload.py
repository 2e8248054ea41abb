"""Storing an uploaded JSONL dataset: checked line by line, content-addressed, one record per
tenant and sha256. Shared by ``POST /v1/datasets`` and OpenAI's ``POST /v1/files``.

An upload may be plain, gzip or zstd JSONL (told by its magic bytes). One streaming pass over
the decompressed lines checks them, hashes them and recompresses them with zstd for the store,
so the gateway never holds the file in memory. The sha256 (and so the dataset id) is of the
decompressed JSONL: the same data uploaded plain or compressed is the same dataset."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException, UploadFile, status

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.layout import dataset_key
from swarm_gateway.dataset_validation import DatasetError, DatasetSummary, JsonlChecker
from swarm_gateway.state import Gateway
from swarm_gateway.uploads import save_upload
from swarm_runtime.dataset_codec import CorruptDataset, open_jsonl, zstd_writer
from swarm_runtime.records import Conflict


@dataclass(frozen=True)
class PreparedDataset:
    summary: DatasetSummary
    sha256: str  # of the decompressed JSONL
    bytes: int  # of the decompressed JSONL


def prepare(upload: Path, stored: Path) -> PreparedDataset:
    """Check ``upload`` (plain, gzip or zstd JSONL) and write it zstd-compressed to ``stored``.

    Raises ``DatasetError`` for bad lines or compressed data that does not decompress."""
    checker = JsonlChecker()
    digest = hashlib.sha256()
    size = 0
    try:
        with (
            open_jsonl(upload) as lines,
            open(stored, "wb") as out,
            zstd_writer(out) as packed,
        ):
            for number, raw in enumerate(lines, start=1):
                checker.line(number, raw)
                digest.update(raw)
                size += len(raw)
                packed.write(raw)
    except CorruptDataset as exc:
        raise DatasetError(str(exc)) from exc
    return PreparedDataset(checker.summary(), digest.hexdigest(), size)


async def store_dataset(
    gw: Gateway, tenant: str, upload: UploadFile, label: str | None
) -> tuple[DatasetInfo, bool]:
    """The dataset's record, and whether it is new (False: the same bytes were uploaded
    before, and that record is the answer). Raises ``DatasetError`` naming the line of a
    file that is no dataset, and an ``HTTPException`` for one over the size limit."""
    limit = gw.settings.max_upload_bytes
    with tempfile.TemporaryDirectory(prefix="swarm-upload-") as tmp:
        path = Path(tmp) / "upload"
        stored = Path(tmp) / "data.jsonl.zst"
        await save_upload(upload, path, limit)
        prepared = await asyncio.to_thread(prepare, path, stored)
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

"""Storing an uploaded JSONL dataset: checked line by line, content-addressed, one record per
tenant and sha256. Shared by ``POST /v1/datasets`` and OpenAI's ``POST /v1/files``."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from fastapi import HTTPException, UploadFile, status

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.layout import dataset_key
from swarm_gateway.dataset_validation import validate_jsonl
from swarm_gateway.state import Gateway
from swarm_gateway.uploads import save_upload
from swarm_runtime.records import Conflict


async def store_dataset(
    gw: Gateway, tenant: str, upload: UploadFile, label: str | None
) -> tuple[DatasetInfo, bool]:
    """The dataset's record, and whether it is new (False: the same bytes were uploaded
    before, and that record is the answer). Raises ``DatasetError`` naming the line of a
    file that is no dataset, and an ``HTTPException`` for one over the size limit."""
    limit = gw.settings.max_upload_bytes
    with tempfile.TemporaryDirectory(prefix="swarm-upload-") as tmp:
        path = Path(tmp) / "data.jsonl"
        size, sha = await save_upload(upload, path, limit)
        summary = await asyncio.to_thread(validate_jsonl, path)

        dataset_id = dataset_id_for(sha)
        kv_key = f"{tenant}.{dataset_id}"
        existing = await gw.datasets.get(kv_key)
        if existing is not None:
            return existing[0], False

        store_key = dataset_key(tenant, sha)
        # Content-addressed: identical bytes already stored need not travel again.
        if not await asyncio.to_thread(gw.store.exists, store_key):
            await asyncio.to_thread(gw.store.put_file, store_key, path)

    info = DatasetInfo(
        id=dataset_id,
        tenant=tenant,
        name=label,
        sha256=sha,
        store_key=store_key,
        format=summary.format,
        examples=summary.examples,
        bytes=size,
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

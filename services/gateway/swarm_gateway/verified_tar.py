"""Downloads of registered files (an adapter's, a base model's) as one tar, verified first.

Each file is copied out of the store and hashed *before* the response starts, and the tar is
built from those verified copies, so bytes that do not match the recorded sha256 are never
sent. A mismatch or a missing file is a 502 naming the file: the fault is in the store behind
the gateway, not in the request.
"""

from __future__ import annotations

import asyncio
import shutil
import tarfile
import tempfile
from pathlib import Path

from fastapi import HTTPException, status
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from swarm_contracts.layout import join_key, validate_key
from swarm_runtime.store import NotFound, ObjectStore, sha256_file


def fetch_verified(
    store: ObjectStore, store_key: str, files: dict[str, str], work: Path
) -> list[str]:
    """Copy and check every file; on success write ``work/files.tar``. Returns the problems,
    one per bad file (sync: call it in a thread)."""
    local_root = work / "files"
    bad = []
    for rel, expected in sorted(files.items()):
        local = local_root / validate_key(rel)
        try:
            store.get_file(join_key(store_key, rel), local)
        except NotFound:
            bad.append(f"{rel} is missing")
            continue
        actual = sha256_file(local)
        if actual != expected:
            bad.append(f"{rel} has sha256 {actual}, expected {expected}")
    if not bad:
        with tarfile.open(work / "files.tar", "w") as tar:
            for rel in sorted(files):
                tar.add(local_root / rel, arcname=rel, recursive=False)
    return bad


async def verified_tar(
    store: ObjectStore, store_key: str, files: dict[str, str], what: str, filename: str
) -> FileResponse:
    """The files as a tar response; 502 naming the bad files (nothing sent) otherwise."""
    work = Path(tempfile.mkdtemp(prefix="swarm-download-"))
    try:
        bad = await asyncio.to_thread(fetch_verified, store, store_key, files, work)
        if bad:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY,
                detail=f"{what} is corrupted in the store: {'; '.join(bad)}; not served",
            )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return FileResponse(
        work / "files.tar",
        media_type="application/x-tar",
        filename=filename,
        background=BackgroundTask(shutil.rmtree, work, ignore_errors=True),
    )

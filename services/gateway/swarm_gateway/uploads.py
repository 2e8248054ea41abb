"""Copy uploaded files to temp files chunk by chunk, enforcing the size limit as they arrive."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio
from fastapi import HTTPException, Request, UploadFile, status

_CHUNK = 1024 * 1024


def too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        detail=f"upload larger than the limit of {limit} bytes (SWARM_MAX_UPLOAD_BYTES)",
    )


def check_content_length(request: Request, limit: int) -> None:
    """Refuse an oversized upload before reading it, when the client says how big it is."""
    length = request.headers.get("content-length")
    # Multipart framing adds a little; allow for it so that a file of exactly ``limit`` fits.
    if length and length.isdigit() and int(length) > limit + 64 * 1024:
        raise too_large(limit)


async def save_upload(
    upload: UploadFile, target: Path, limit: int, used: int = 0
) -> tuple[int, str]:
    """Write ``upload`` to ``target``; return (bytes, sha256). ``used`` counts earlier files."""
    h = hashlib.sha256()
    size = 0
    async with await anyio.open_file(target, "wb") as out:
        while chunk := await upload.read(_CHUNK):
            size += len(chunk)
            if used + size > limit:
                raise too_large(limit)
            h.update(chunk)
            await out.write(chunk)
    return size, h.hexdigest()

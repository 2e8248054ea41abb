"""Datasets at rest and in transit: plain, gzip or zstd JSONL, read as one stream of lines.

Uploads may be compressed (told apart by their magic bytes, not their names); the store holds
every new dataset as zstd, and old datasets stored plain stay readable. Readers never hold a
whole file: decompression runs chunk by chunk. Python's readers stop silently at the end of a
truncated gzip or zstd file, so this one checks that the last frame ended and says so if not.
"""

from __future__ import annotations

import contextlib
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal, Protocol, cast

import zstandard

from swarm_runtime.store import ObjectStore

Compression = Literal["plain", "gzip", "zstd"]

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Small input chunks bound what one decompress call can return (zstd's objects take no
# output limit), so memory stays flat even for highly compressible data.
_IN_CHUNK = 16 * 1024
_OUT_CHUNK = 1024 * 1024
ZSTD_LEVEL = 3


class CorruptDataset(ValueError):
    """A compressed file that does not decompress: truncated or not what its header says."""


class _Decompressor(Protocol):
    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes, /) -> bytes: ...


def compression_of(head: bytes) -> Compression:
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return "plain"


def detect(path: Path) -> Compression:
    with open(path, "rb") as f:
        return compression_of(f.read(4))


def _new(kind: Compression) -> _Decompressor:
    if kind == "gzip":
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # type: ignore[return-value]
    return zstandard.ZstdDecompressor().decompressobj()  # type: ignore[return-value]


class _DecompressingReader(io.RawIOBase):
    """The decompressed bytes of ``source``, across concatenated frames/members."""

    def __init__(self, source: BinaryIO, kind: Compression) -> None:
        self._source = source
        self._kind = kind
        self._dec = _new(kind)
        self._input = b""
        self._pending = b""
        self._offset = 0  # into _pending: slicing it on every read would copy it again
        self._started = False
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while self._offset >= len(self._pending) and not self._done:
            self._pending, self._offset = self._step(), 0
        n = min(len(buffer), len(self._pending) - self._offset)
        buffer[:n] = self._pending[self._offset : self._offset + n]
        self._offset += n
        return n

    def _step(self) -> bytes:
        if not self._input:
            self._input = self._source.read(_IN_CHUNK)
            if not self._input:
                if self._started and not self._dec.eof:
                    raise CorruptDataset(f"the {self._kind} data ends early (truncated upload?)")
                self._done = True
                return b""
        self._started = True
        try:
            if self._kind == "gzip":
                # zlib can cap its output: what it did not get to waits in unconsumed_tail.
                gz = cast("zlib._Decompress", self._dec)
                out = gz.decompress(self._input, _OUT_CHUNK)
                self._input = gz.unconsumed_tail
            else:
                out = self._dec.decompress(self._input)
                self._input = b""
        except (zlib.error, zstandard.ZstdError) as exc:
            raise CorruptDataset(f"the {self._kind} data is corrupt: {exc}") from exc
        if self._dec.eof:
            # One frame (gzip member) ended; what follows starts the next one.
            self._input = self._dec.unused_data + self._input
            self._dec = _new(self._kind)
            self._started = False
        return out


@contextlib.contextmanager
def open_jsonl(path: Path) -> Iterator[BinaryIO]:
    """``path``'s JSONL bytes, decompressed while read if the file is gzip or zstd.

    Reading raises ``CorruptDataset`` where the compressed data is damaged or cut short."""
    kind = detect(path)
    with open(path, "rb") as raw:
        if kind == "plain":
            yield raw
            return
        reader = _DecompressingReader(raw, kind)
        yield io.BufferedReader(reader, buffer_size=_OUT_CHUNK)


def zstd_writer(target: BinaryIO) -> BinaryIO:
    """A writer that zstd-compresses into ``target`` (closing it finishes the frame)."""
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(target, closefd=False)


def decompress_file(source: Path, target: Path) -> None:
    """Write ``source``'s JSONL to ``target`` (a copy when ``source`` is plain)."""
    with open_jsonl(source) as f, open(target, "wb") as out:
        while chunk := f.read(_OUT_CHUNK):
            out.write(chunk)


def fetch_jsonl(store: ObjectStore, key: str, target: Path) -> None:
    """The stored dataset ``key`` as plain JSONL at ``target``, however the store holds it."""
    stored = target.with_name(target.name + ".stored")
    store.get_file(key, stored)
    try:
        if detect(stored) == "plain":
            os.replace(stored, target)
        else:
            decompress_file(stored, target)
    finally:
        stored.unlink(missing_ok=True)

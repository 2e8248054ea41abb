"""Datasets at rest and in transit: plain, gzip or zstd JSONL, read as one stream of lines.

Uploads may be compressed (told apart by their magic bytes, not their names); the store holds
every new dataset as zstd, and old datasets stored plain stay readable. Readers never hold a
whole file: decompression runs chunk by chunk. Python's readers stop silently at the end of a
truncated gzip or zstd file, so this one checks that the last frame ended and says so if not.

The store's zstd is *seekable*: independent frames of about ``FRAME_BYTES`` of JSONL each,
cut only at line ends, and a seek table at the end (zstd's seekable format: a skippable frame
that every zstd reader passes over). A trainer's rank reads its frames with byte-range reads
and decompresses them alone (``swarm_runtime.dataset_frames``), so no rank reads the whole
dataset.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
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
# JSONL bytes per stored frame (a frame ends at the first line end past this): the unit a rank
# reads, tokenizes and caches. Small enough for a quick first step and a fine-grained shuffle,
# large enough that zstd compresses about as well as one frame would.
FRAME_BYTES = 1 << 20
SKIPPABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
_SKIPPABLE_HEADER = struct.Struct("<II")  # magic, frame size
_SEEK_ENTRY = struct.Struct("<II")  # compressed size, decompressed size
_SEEK_FOOTER = struct.Struct("<IBI")  # frames, descriptor, seekable magic
SEEK_FOOTER_BYTES = _SEEK_FOOTER.size
_CHECKSUMS = 0x80  # descriptor bit: every entry carries a checksum too


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
def open_jsonl(path: Path, raw: BinaryIO | None = None) -> Iterator[BinaryIO]:
    """``path``'s JSONL bytes, decompressed while read if the file is gzip or zstd; read
    through ``raw`` (``path`` opened by the caller, whose position then tells how far the
    reading got) when given.

    Reading raises ``CorruptDataset`` where the compressed data is damaged or cut short."""
    kind = detect(path)
    with contextlib.ExitStack() as stack:
        if raw is None:
            raw = stack.enter_context(open(path, "rb"))
        if kind == "plain":
            yield raw
            return
        reader = _DecompressingReader(raw, kind)
        yield io.BufferedReader(reader, buffer_size=_OUT_CHUNK)


@dataclass(frozen=True)
class Frame:
    """One independently decompressible frame of a seekable zstd object."""

    offset: int  # where it starts in the stored object
    size: int  # its compressed bytes
    bytes: int  # the JSONL bytes it holds


class FramedZstdWriter:
    """Writes JSONL to ``target`` as seekable zstd (see the module's docstring): a frame ends
    at the first line end after ``frame_bytes``, and closing writes the seek table (``target``
    stays open)."""

    def __init__(self, target: BinaryIO, frame_bytes: int = FRAME_BYTES) -> None:
        self._target = target
        self._frame_bytes = frame_bytes
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        self._frame = self._compressor.compressobj()
        self._in = 0  # JSONL bytes in the open frame
        self._out = 0  # compressed bytes of the open frame written so far
        self._table: list[tuple[int, int]] = []
        self._closed = False

    def write(self, data: bytes) -> int:
        rest = memoryview(data)
        while len(rest):
            full_at = max(self._frame_bytes - self._in - 1, 0)
            end = bytes(rest[full_at:]).find(b"\n") if full_at < len(rest) else -1
            take = len(rest) if end < 0 else full_at + end + 1
            self._put(rest[:take])
            rest = rest[take:]
            if end >= 0:
                self._end_frame()
        return len(data)

    def _put(self, data: memoryview) -> None:
        out = self._frame.compress(data)
        self._target.write(out)
        self._in += len(data)
        self._out += len(out)

    def _end_frame(self) -> None:
        out = self._frame.flush()
        self._target.write(out)
        if self._in >= 2**32:
            raise ValueError("a JSONL line of 4 GiB or more does not fit a seekable frame")
        self._table.append((self._out + len(out), self._in))
        self._frame = self._compressor.compressobj()
        self._in = self._out = 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._in:
            self._end_frame()
        entries = b"".join(_SEEK_ENTRY.pack(c, d) for c, d in self._table)
        footer = _SEEK_FOOTER.pack(len(self._table), 0, SEEKABLE_MAGIC)
        body = entries + footer
        self._target.write(_SKIPPABLE_HEADER.pack(SKIPPABLE_MAGIC, len(body)) + body)

    def __enter__(self) -> FramedZstdWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()


def zstd_writer(target: BinaryIO, frame_bytes: int = FRAME_BYTES) -> FramedZstdWriter:
    """A writer that zstd-compresses JSONL into ``target`` as seekable frames (closing it
    finishes the last frame and writes the seek table)."""
    return FramedZstdWriter(target, frame_bytes)


def seek_table_bytes(footer: bytes) -> int | None:
    """How many bytes at the end of the object hold its seek table, from its last
    ``SEEK_FOOTER_BYTES``; None when the object has none (plain, gzip, or zstd written before
    frames)."""
    if len(footer) != SEEK_FOOTER_BYTES:
        return None
    frames, descriptor, magic = _SEEK_FOOTER.unpack(footer)
    if magic != SEEKABLE_MAGIC:
        return None
    entry = _SEEK_ENTRY.size + (4 if descriptor & _CHECKSUMS else 0)
    return _SKIPPABLE_HEADER.size + frames * entry + SEEK_FOOTER_BYTES


def parse_seek_table(table: bytes, object_size: int) -> list[Frame]:
    """The frames of a seekable object, from the last ``seek_table_bytes`` of it."""
    magic, body = _SKIPPABLE_HEADER.unpack_from(table)
    frames, descriptor, _ = _SEEK_FOOTER.unpack_from(table, len(table) - SEEK_FOOTER_BYTES)
    entry = _SEEK_ENTRY.size + (4 if descriptor & _CHECKSUMS else 0)
    if magic != SKIPPABLE_MAGIC or body != len(table) - _SKIPPABLE_HEADER.size:
        raise CorruptDataset("the zstd seek table is damaged")
    found: list[Frame] = []
    offset = 0
    for i in range(frames):
        size, size_out = _SEEK_ENTRY.unpack_from(table, _SKIPPABLE_HEADER.size + i * entry)
        found.append(Frame(offset, size, size_out))
        offset += size
    if offset != object_size - len(table):
        raise CorruptDataset("the zstd seek table does not add up to the object's size")
    return found


def decompress_frame(data: bytes, expected: int) -> bytes:
    """One frame's JSONL, checked against the length its seek table gives."""
    dec = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = dec.decompress(data)
    except zstandard.ZstdError as exc:
        raise CorruptDataset(f"a zstd frame is corrupt: {exc}") from exc
    if not dec.eof or len(out) != expected:
        raise CorruptDataset(
            f"a zstd frame holds {len(out)} bytes where its seek table says {expected}"
        )
    return out


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

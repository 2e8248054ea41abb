"""A stored dataset as numbered frames of whole JSONL lines, each read on its own by byte ranges.

A frame is the unit a trainer's rank reads, tokenizes and caches (``swarm_trainer.stream``):

* seekable zstd (what the gateway stores, ``dataset_codec.FramedZstdWriter``): the frames its
  seek table lists, each one range read and decompressed alone;
* plain JSONL (datasets stored before compression, or a local copy): ``FRAME_BYTES`` byte
  ranges, a line belonging to the range it starts in, read with range reads that go on past
  the range's end only to finish its last line.

Gzip and zstd written before frames can only be read from the start: ``open_frames`` answers
None for them, and the caller reads a local plain copy instead. Every reader counts the bytes
it took from its source (``bytes_read``), what the streaming benchmark reports per rank.
"""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from swarm_runtime.dataset_codec import (
    FRAME_BYTES,
    SEEK_FOOTER_BYTES,
    Frame,
    compression_of,
    decompress_frame,
    parse_seek_table,
    seek_table_bytes,
)
from swarm_runtime.store import ObjectStore

# What a plain frame reads first while it looks for a line end, doubled while none is found:
# most lines are shorter, so the frame's reads add little to its own bytes.
_PROBE = 4096
_PROBE_MAX = 1 << 20

RangeReader = Callable[[int, int], bytes]  # (start, length) -> bytes, as ObjectStore.get_range


class DatasetFrames(ABC):
    """``count`` frames, each a run of whole JSONL lines; together, the whole dataset in order."""

    count: int
    # Names how the object is cut into frames: a cache of frames is only valid for the same
    # cut (``swarm_trainer.token_cache``).
    layout: str

    def __init__(self) -> None:
        self.bytes_read = 0
        self._lock = threading.Lock()  # a prefetching thread reads beside the loop

    def _counted(self, data: bytes) -> bytes:
        with self._lock:
            self.bytes_read += len(data)
        return data

    @abstractmethod
    def read(self, index: int) -> bytes:
        """Frame ``index``'s JSONL bytes (whole lines; possibly none)."""


class ZstdFrames(DatasetFrames):
    def __init__(self, read_range: RangeReader, frames: list[Frame], table: bytes) -> None:
        super().__init__()
        self._read_range = read_range
        self.frames = frames
        self.count = len(frames)
        self.layout = "zstd-" + hashlib.sha256(table).hexdigest()[:16]

    def read(self, index: int) -> bytes:
        frame = self.frames[index]
        data = self._counted(self._read_range(frame.offset, frame.size))
        return decompress_frame(data, frame.bytes)


class PlainFrames(DatasetFrames):
    def __init__(self, read_range: RangeReader, size: int, frame_bytes: int = FRAME_BYTES) -> None:
        super().__init__()
        self._read_range = read_range
        self.size = size
        self.frame_bytes = frame_bytes
        self.count = max(1, -(-size // frame_bytes))
        self.layout = f"plain-{frame_bytes}"

    def read(self, index: int) -> bytes:
        low = index * self.frame_bytes
        high = min(low + self.frame_bytes, self.size)
        # The frame holds the lines that start in [low, high): from the first line start at
        # or after ``low`` to the first at or after ``high``.
        first = low if low == 0 else self._line_start(low - 1)
        if first is None or first >= high:
            return b""
        end = self._line_start(high - 1) if high < self.size else self.size
        return self._counted(self._read_range(first, (end or self.size) - first))

    def _line_start(self, at: int) -> int | None:
        """Where the line after the first line end at or after ``at`` starts (None: none)."""
        probe = _PROBE
        while at < self.size:
            chunk = self._counted(self._read_range(at, probe))
            if not chunk:
                return None
            found = chunk.find(b"\n")
            if found >= 0:
                return at + found + 1
            at += len(chunk)
            probe = min(probe * 2, _PROBE_MAX)
        return None


def open_frames(store: ObjectStore, key: str) -> DatasetFrames | None:
    """The stored dataset ``key`` by frames; None when it can only be read from its start
    (gzip, or zstd without a seek table)."""
    size = store.size(key)

    def read_range(start: int, length: int) -> bytes:
        return store.get_range(key, start, length)

    head = store.get_range(key, 0, 4)
    kind = compression_of(head)
    if kind == "plain":
        return PlainFrames(read_range, size)
    if kind == "gzip" or size < SEEK_FOOTER_BYTES:
        return None
    table_bytes = seek_table_bytes(
        store.get_range(key, size - SEEK_FOOTER_BYTES, SEEK_FOOTER_BYTES)
    )
    if table_bytes is None or table_bytes > size:
        return None
    table = store.get_range(key, size - table_bytes, table_bytes)
    frames = ZstdFrames(read_range, parse_seek_table(table, size), table)
    frames.bytes_read = 4 + SEEK_FOOTER_BYTES + table_bytes
    return frames


def local_frames(path: Path) -> PlainFrames:
    """A local plain JSONL file by frames (the copy of a dataset ``open_frames`` cannot cut)."""

    def read_range(start: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    return PlainFrames(read_range, path.stat().st_size)

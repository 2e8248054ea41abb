"""Seekable zstd datasets and reading a dataset frame by frame with byte ranges: every frame
is whole lines, the frames in order are the dataset, a frame read costs about its own bytes,
and what cannot be cut into frames (gzip, zstd without a seek table) says so."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest
import zstandard

from swarm_runtime.dataset_codec import (
    CorruptDataset,
    decompress_file,
    open_jsonl,
    zstd_writer,
)
from swarm_runtime.dataset_frames import PlainFrames, ZstdFrames, local_frames, open_frames
from swarm_runtime.store import LocalStore


def lines(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    return b"".join(
        json.dumps({"text": f"{i} " + "x" * rnd.randint(0, 700)}).encode() + b"\n" for i in range(n)
    )


def seekable(data: bytes, frame_bytes: int) -> bytes:
    out = io.BytesIO()
    with zstd_writer(out, frame_bytes) as writer:
        # Written in pieces that do not follow the lines, as a decompressing copy writes.
        for at in range(0, len(data), 1000):
            writer.write(data[at : at + 1000])
    return out.getvalue()


def test_seekable_zstd_cuts_at_line_ends_and_reads_back_whole(tmp_path: Path) -> None:
    data = lines(300)
    packed = seekable(data, frame_bytes=8192)
    store = LocalStore(tmp_path / "store")
    store.put_bytes("d/x.jsonl.zst", packed)

    frames = open_frames(store, "d/x.jsonl.zst")
    assert isinstance(frames, ZstdFrames)
    assert frames.count == pytest.approx(len(data) / 8192, abs=2)
    parts = [frames.read(i) for i in range(frames.count)]
    assert b"".join(parts) == data
    for part in parts:
        assert part.endswith(b"\n")
        assert len(part) >= 8192 or part is parts[-1]
        assert all(json.loads(line) for line in part.splitlines())
    # Any zstd reader takes the whole object (it passes over the seek table's frame).
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed)).read() == data
    (tmp_path / "x.zst").write_bytes(packed)
    with open_jsonl(tmp_path / "x.zst") as f:
        assert f.read() == data
    decompress_file(tmp_path / "x.zst", tmp_path / "x.jsonl")
    assert (tmp_path / "x.jsonl").read_bytes() == data


def test_a_share_of_the_frames_reads_about_its_share_of_the_bytes(tmp_path: Path) -> None:
    data = lines(12_000, seed=1)  # plain: about 4 frames of FRAME_BYTES
    store = LocalStore(tmp_path / "store")
    store.put_bytes("d/z", seekable(data, frame_bytes=16384))
    store.put_bytes("d/p", data)
    for key in ("d/z", "d/p"):
        frames = open_frames(store, key)
        assert frames is not None
        assert frames.count >= 4
        half = [frames.read(i) for i in range(frames.count // 2)]
        share = frames.bytes_read / store.size(key)
        assert data.startswith(b"".join(half))
        # The bytes read are the share of the data those frames hold, and little more.
        assert share == pytest.approx(len(b"".join(half)) / len(data), abs=0.02), key


@pytest.mark.parametrize("frame_bytes", [1, 7, 100, 4096, 10**6])
def test_plain_frames_are_whole_lines_and_together_the_file(
    tmp_path: Path, frame_bytes: int
) -> None:
    # Lines longer than a frame, an empty line, and no line end at the very end.
    data = lines(40, seed=2) + b"\n" + b'{"text": "' + b"y" * 3000 + b'"}\n' + b'{"text": "last"}'
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    frames = local_frames(path) if frame_bytes == 10**6 else None
    frames = frames or PlainFrames(lambda at, n: data[at : at + n], len(data), frame_bytes)
    parts = [frames.read(i) for i in range(frames.count)]
    assert b"".join(parts) == data
    filled = [p for p in parts if p]
    assert all(p.endswith(b"\n") for p in filled[:-1])


def test_what_cannot_be_cut_into_frames_says_so(tmp_path: Path) -> None:
    data = lines(50)
    store = LocalStore(tmp_path / "store")
    store.put_bytes("d/gz", gzip.compress(data))
    store.put_bytes("d/one-frame", zstandard.ZstdCompressor().compress(data))
    assert open_frames(store, "d/gz") is None
    assert open_frames(store, "d/one-frame") is None


def test_a_damaged_frame_is_an_error_not_wrong_lines(tmp_path: Path) -> None:
    packed = bytearray(seekable(lines(300), frame_bytes=8192))
    store = LocalStore(tmp_path / "store")
    frames = open_frames(store, _put(store, "d/ok", bytes(packed)))
    assert isinstance(frames, ZstdFrames)
    second = frames.frames[1]
    packed[second.offset + second.size // 2] ^= 0xFF
    damaged = open_frames(store, _put(store, "d/bad", bytes(packed)))
    assert damaged is not None
    damaged.read(0)
    with pytest.raises(CorruptDataset):
        damaged.read(1)
    # A seek table that does not add up to the object: refused when the frames are opened.
    with pytest.raises(CorruptDataset):
        open_frames(store, _put(store, "d/cut", b"\x28\xb5\x2f\xfd" + bytes(packed[20:])))


def _put(store: LocalStore, key: str, data: bytes) -> str:
    store.put_bytes(key, data)
    return key

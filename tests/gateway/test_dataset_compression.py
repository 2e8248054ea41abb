"""Compressed uploads (gzip, zstd), the report of many bad lines, corrupt compressed files, and
the gateway's memory while it checks a large upload."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import httpx
import pytest
import zstandard

from swarm_gateway.dataset_upload import prepare
from swarm_runtime.dataset_frames import ZstdFrames, open_frames
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


PC = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(50)]


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


async def upload(client: httpx.AsyncClient, data: bytes, filename: str) -> httpx.Response:
    return await client.post("/v1/datasets", files={"file": (filename, data)})


def stored_datasets(settings: Settings) -> list[str]:
    return open_store(settings).list("datasets/")


async def test_plain_gzip_and_zstd_of_the_same_data_are_one_dataset(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    data = jsonl(PC)
    # Names that say nothing: the gateway goes by the magic bytes.
    first = await upload(client, gzip.compress(data), "a.bin")
    assert first.status_code == 201, first.text
    info = first.json()
    assert info["examples"] == 50
    assert info["bytes"] == len(data)  # of the JSONL, not of what travelled
    for other in (data, zstd(data), zstd(data[:100]) + zstd(data[100:])):
        again = await upload(client, other, "b.jsonl")
        assert again.status_code == 200, again.text
        assert again.json()["id"] == info["id"]

    assert stored_datasets(settings) == [info["store_key"]]
    stored = open_store(settings).get_bytes(info["store_key"])
    assert stored.startswith(b"\x28\xb5\x2f\xfd")
    assert zstandard.ZstdDecompressor().decompressobj().decompress(stored) == data
    # Seekable: a trainer's rank reads its frames by byte ranges.
    frames = open_frames(open_store(settings), info["store_key"])
    assert isinstance(frames, ZstdFrames)
    assert b"".join(frames.read(i) for i in range(frames.count)) == data

    stats = await client.get(f"/v1/datasets/{info['id']}/stats")
    assert stats.status_code == 200, stats.text
    assert stats.json()["examples"] == 50
    assert stats.json()["chars"]["max"] == max(len(r["prompt"] + r["completion"]) for r in PC)


async def test_openai_files_take_compressed_uploads_and_give_back_jsonl(
    client: httpx.AsyncClient,
) -> None:
    data = jsonl(PC)
    created = await client.post(
        "/v1/files",
        files={"file": ("train.jsonl.zst", zstd(data))},
        data={"purpose": "fine-tune"},
    )
    assert created.status_code == 200, created.text
    content = await client.get(f"/v1/files/{created.json()['id']}/content")
    assert content.status_code == 200
    assert content.content == data


async def test_the_first_20_bad_lines_are_reported(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    lines = [json.dumps(r) for r in PC[:5]]
    bad = list(range(6, 36))  # 30 bad lines, 1-based numbers
    lines += ["{not json" if n % 2 else '{"prompt": 1, "completion": "x"}' for n in bad]
    resp = await upload(client, gzip.compress(("\n".join(lines) + "\n").encode()), "d.gz")
    assert resp.status_code == 422, resp.text
    message = resp.json()["detail"][0]["msg"]
    assert "30 bad lines (first 20 shown)" in message
    for n in bad[:20]:
        assert f"line {n}:" in message
    for n in bad[20:]:
        assert f"line {n}:" not in message
    assert "not valid JSON" in message
    assert "must both be strings" in message
    assert resp.json()["detail"][0]["loc"] == ["body", "file", "line 6"]
    assert stored_datasets(settings) == []


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
async def test_a_truncated_compressed_upload_is_refused_and_nothing_kept(
    client: httpx.AsyncClient, settings: Settings, kind: str
) -> None:
    data = jsonl(PC * 20)
    packed = gzip.compress(data) if kind == "gzip" else zstd(data)
    resp = await upload(client, packed[: len(packed) // 2], "d.jsonl")
    assert resp.status_code == 422, resp.text
    assert f"the {kind} data ends early" in resp.text
    assert stored_datasets(settings) == []
    assert (await client.get("/v1/datasets")).json()["data"] == []


async def test_corrupt_compressed_bytes_are_refused(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    packed = bytearray(gzip.compress(jsonl(PC * 20)))
    packed[20:40] = b"\x00" * 20
    resp = await upload(client, bytes(packed), "d.jsonl.gz")
    assert resp.status_code == 422, resp.text
    assert "the gzip data is corrupt" in resp.text
    assert stored_datasets(settings) == []


def test_checking_a_large_upload_takes_constant_memory(tmp_path: Path) -> None:
    """~50 MB of JSONL (gzip on disk) checked and recompressed with a small, flat peak."""
    row = json.dumps({"text": "x" * 1000}) + "\n"
    count = 50_000
    upload_file = tmp_path / "big.jsonl.gz"
    with gzip.open(upload_file, "wt", compresslevel=1) as f:
        for _ in range(count):
            f.write(row)
    tracemalloc.start()
    try:
        prepared = prepare(upload_file, tmp_path / "stored.zst")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert prepared.summary.examples == count
    assert prepared.bytes == count * len(row) > 50_000_000
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB while checking 50 MB"

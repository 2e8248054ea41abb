"""``swarm datasets upload`` of compressed files, and the client streaming a large file."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import zstandard
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import Client

runner = CliRunner()
ROWS = "".join(json.dumps({"text": f"example {i}"}) + "\n" for i in range(20)).encode()


def upload(gateway_url: str, path: Path) -> dict:
    result = runner.invoke(app, ["--url", gateway_url, "datasets", "upload", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_cli_uploads_gzip_and_zstd_as_the_same_dataset(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plain = tmp_path / "train.jsonl"
    plain.write_bytes(ROWS)
    gz = tmp_path / "train.jsonl.gz"
    gz.write_bytes(gzip.compress(ROWS))
    zst = tmp_path / "train.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(ROWS))
    first = upload(gateway.url, zst)
    assert first["examples"] == 20
    assert first["bytes"] == len(ROWS)
    assert upload(gateway.url, gz)["id"] == first["id"]
    assert upload(gateway.url, plain)["id"] == first["id"]


def test_cli_reports_a_truncated_file(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    packed = zstandard.ZstdCompressor().compress(ROWS * 50)
    bad = tmp_path / "train.jsonl.zst"
    bad.write_bytes(packed[: len(packed) // 2])
    result = runner.invoke(app, ["--url", gateway.url, "datasets", "upload", str(bad)])
    assert result.exit_code == 2, result.output
    assert "ends early" in result.output
    assert Client(gateway.url).list_datasets() == []


def test_a_large_upload_streams_from_disk(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """15 MB through the client and the gateway (in this process) under a peak below the file
    size: neither side holds the file (measured flat at ~8.6 MB for 10 and 30 MB)."""
    row = json.dumps({"text": "y" * 1000}) + "\n"
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for _ in range(15_000):
            f.write(row)
    # A small upload first: what the client and the gateway build once (clients, validators,
    # a route's first use) is no part of what grows with the file.
    small = tmp_path / "small.jsonl"
    small.write_text(row * 10)
    Client(gateway.url).upload_dataset(small)
    tracemalloc.start()
    try:
        info = Client(gateway.url).upload_dataset(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.examples == 15_000
    assert peak < 12 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB for a 15 MB upload"

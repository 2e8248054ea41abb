"""Uploads checked in the background: the answer once the file is in, then the check's
progress, then the dataset or the bad lines, for the uploading tenant only."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from swarm import AsyncClient, NotFoundError
from swarm_contracts.datasets import DatasetUpload
from swarm_gateway import dataset_upload
from swarm_gateway.dataset_validation import DatasetError

from ..conftest import ServerThread
from .conftest import ADMIN, ALICE


def _lines(n: int) -> list[str]:
    return [json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) for i in range(n)]


async def _until_checked(c: AsyncClient, upload_id: str) -> DatasetUpload:
    for _ in range(600):
        upload = await c.dataset_upload(upload_id)
        if upload.state != "validating":
            return upload
        await asyncio.sleep(0.05)
    raise AssertionError("the check never ended")


async def test_a_background_upload_becomes_the_dataset_or_names_its_bad_lines(
    tenant_stack: ServerThread, tmp_path: Path
) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(_lines(20_000)) + "\n")
    async with AsyncClient(tenant_stack.url, api_key=ALICE) as c:
        started = await c.start_dataset_upload(good)
        assert started.upload_id.startswith("dsu-")
        assert (started.state, started.bytes_total) == ("validating", good.stat().st_size)
        done = await _until_checked(c, started.upload_id)
        assert done.state == "ready", done
        assert done.bytes_checked == done.bytes_total
        assert done.lines_checked == 20_000
        assert done.dataset is not None
        assert done.dataset.examples == 20_000
        assert [d.id for d in await c.list_datasets()] == [done.dataset.id]

        lines = _lines(10_000)
        lines[7320] = json.dumps({"prompt": "q7320"})  # line 7,321
        lines[8000] = "nope"  # line 8,001
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join(lines) + "\n")
        failed = await _until_checked(c, (await c.start_dataset_upload(bad)).upload_id)
        assert failed.state == "invalid"
        assert failed.bad_lines == [7321, 8001]
        assert failed.error is not None
        assert "line 7321" in failed.error
        assert failed.dataset is None
        assert len(await c.list_datasets()) == 1  # nothing registered
    async with AsyncClient(tenant_stack.url, api_key=ADMIN) as admin:
        with pytest.raises(NotFoundError):
            await admin.dataset_upload(started.upload_id)  # alice's upload


def test_the_check_reports_how_far_it_got_in_the_uploaded_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataset_upload, "PROGRESS_EVERY_S", 0.0)  # every line
    packed = tmp_path / "d.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write("\n".join(_lines(5_000)) + "\n")
    seen: list[tuple[int, int]] = []
    dataset_upload.prepare(packed, tmp_path / "out.zst", lambda read, n: seen.append((read, n)))
    reads = [r for r, _ in seen]
    assert reads == sorted(reads)  # in the compressed file's bytes, as sent
    assert 0 < reads[len(reads) // 2] < packed.stat().st_size
    assert seen[-1] == (packed.stat().st_size, 5_000)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    with pytest.raises(DatasetError):
        dataset_upload.prepare(bad, tmp_path / "bad.zst", lambda read, n: None)

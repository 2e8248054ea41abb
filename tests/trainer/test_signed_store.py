"""``SignedStore``: a store without keys, every operation granted by the registry, against a
real S3 server and the real registry; and the pyarrow filesystem Ray Train persists through,
in this process and unpickled in a fresh one (as Ray's workers and controller get it)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.fs
import pytest
from pydantic import SecretStr

from swarm_registry import build_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import NotFound, S3Store, open_store
from swarm_trainer.signed_store import SignedAccess, SignedStore, StoreAccessRefused

from ..conftest import S3Server
from ..registry.test_store_access import MODEL, PARENT, Jobs, s3_settings, seed_jobs
from ..runtime.test_store_outage import FlakyProxy

RUN = "checkpoints/job-a/attempt-2"


@pytest.fixture
async def world(
    settings: Settings, s3_server: S3Server
) -> AsyncIterator[tuple[SignedStore, S3Store, Jobs]]:
    s3 = s3_settings(settings, s3_server)
    store = open_store(s3)
    assert isinstance(store, S3Store)
    jobs = await seed_jobs(s3, store)
    app = build_app(s3)
    await app.start()
    # What the agent hands its ranks: how to reach NATS and the attempt's grant; no store keys.
    access = SignedAccess(
        nats=Settings(nats_url=s3.nats_url, namespace=s3.namespace),
        job_id="job-a",
        attempt=2,
        attempt_token=SecretStr("token-a"),
        worker_id="w",
    )
    try:
        yield SignedStore(access), store, jobs
    finally:
        await app.stop()


async def blocking(fn: Callable[[], Any]) -> Any:
    # The registry answers on this test's event loop: the store's blocking calls go elsewhere.
    return await asyncio.to_thread(fn)


def refused(fn: Callable[[], Any]) -> str:
    with pytest.raises(StoreAccessRefused) as info:
        fn()
    return info.value.code


async def test_reads_and_writes_within_the_jobs_scope(
    world: tuple[SignedStore, S3Store, Jobs], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed, store, jobs = world
    asked: list[str] = []
    grant = signed.grant
    monkeypatch.setattr(signed, "grant", lambda op, key: asked.append(op) or grant(op, key))

    def within() -> None:
        assert signed.get_bytes(jobs.datasets["job-a"]) == b'{"text": "job-a data"}\n'
        # Byte ranges of an object in scope (what a rank streams its share of a dataset by),
        # through one grant reused for every range.
        assert signed.size(jobs.datasets["job-a"]) == 23
        assert signed.get_range(jobs.datasets["job-a"], 2, 4) == b"text"
        assert signed.get_range(jobs.datasets["job-a"], 20, 10) == b'"}\n'
        assert signed.get_range(jobs.datasets["job-a"], 23, 10) == b""
        assert asked.count("get") == 2  # get_bytes's, and one for all the ranges
        assert signed.sha256(jobs.datasets["job-a"]) == store.sha256(jobs.datasets["job-a"])
        files = signed.download_dir(MODEL, tmp_path / "model")
        assert sorted(p.name for p in files) == ["config.json", "model.safetensors"]
        assert (tmp_path / "model" / "config.json").read_bytes() == b"model config.json"
        assert signed.exists(f"{PARENT}/adapter_model.safetensors")
        assert not signed.exists(f"{RUN}/nothing")
        with pytest.raises(NotFound):
            signed.get_bytes(f"{RUN}/nothing")

        tree = tmp_path / "ckpt"
        (tree / "sub").mkdir(parents=True)
        (tree / "adapter_model.safetensors").write_bytes(b"w" * 3000)
        (tree / "sub" / "state.json").write_text("{}")
        (tree / "empty").write_bytes(b"")
        digests = signed.upload_dir(tree, f"{RUN}/checkpoint_00000002")
        assert digests == store.file_digests(f"{RUN}/checkpoint_00000002")
        assert signed.list(f"{RUN}/") == [
            f"{RUN}/checkpoint_00000002/adapter_model.safetensors",
            f"{RUN}/checkpoint_00000002/empty",
            f"{RUN}/checkpoint_00000002/sub/state.json",
        ]
        signed.download_dir(f"{RUN}/checkpoint_00000002", tmp_path / "back")
        assert (tmp_path / "back" / "adapter_model.safetensors").read_bytes() == b"w" * 3000
        signed.get_file(f"{RUN}/checkpoint_00000002/sub/state.json", tmp_path / "one.json")
        assert (tmp_path / "one.json").read_text() == "{}"
        signed.put_bytes("outputs/job-a/2/result.json", b"{}")
        signed.delete_prefix(f"{RUN}/")
        assert store.list(f"{RUN}/") == []
        signed.delete(f"{RUN}/never-there")  # as in S3: no error
        # An earlier attempt's checkpoint is readable (a resume), not writable.
        earlier = "checkpoints/job-a/attempt-1/checkpoint_00000001/adapter_model.safetensors"
        assert signed.get_bytes(earlier) == b"job-a checkpoint"
        assert refused(lambda: signed.delete(earlier)) == "forbidden"

    await blocking(within)
    assert store.get_bytes("outputs/job-a/2/result.json") == b"{}"


async def test_outside_the_scope_nothing_is_granted(
    world: tuple[SignedStore, S3Store, Jobs], tmp_path: Path
) -> None:
    signed, store, jobs = world
    other = jobs.datasets["job-b"]
    (tmp_path / "f").write_bytes(b"x")

    def outside() -> None:
        assert refused(lambda: signed.get_bytes(other)) == "forbidden"
        assert refused(lambda: signed.get_range(other, 0, 5)) == "forbidden"
        assert refused(lambda: signed.get_file(other, tmp_path / "stolen")) == "forbidden"
        assert refused(lambda: signed.list("datasets/")) == "forbidden"
        assert refused(lambda: signed.download_dir("checkpoints/job-b", tmp_path / "b")) == (
            "forbidden"
        )
        assert refused(lambda: signed.put_file(other, tmp_path / "f")) == "forbidden"
        assert refused(lambda: signed.upload_dir(tmp_path, "checkpoints/job-b/attempt-1")) == (
            "forbidden"
        )
        assert refused(lambda: signed.put_bytes(f"{MODEL}/config.json", b"evil")) == "forbidden"

    await blocking(outside)
    assert not (tmp_path / "stolen").exists()
    assert store.get_bytes(f"{MODEL}/config.json") == b"model config.json"


async def test_ray_storage_filesystem(
    world: tuple[SignedStore, S3Store, Jobs], tmp_path: Path
) -> None:
    """What Ray Train does with its storage filesystem: a marker and snapshot written through
    output streams, checkpoint directories uploaded and downloaded with ``copy_files``, file
    infos, listings and pruning; and the same filesystem unpickled in a fresh process."""
    signed, store, _ = world
    root, fs = signed.ray_storage("checkpoints/job-a")
    assert root == "checkpoints/job-a"
    local = tmp_path / "checkpoint"
    (local / "nested").mkdir(parents=True)
    (local / "adapter_model.safetensors").write_bytes(b"a" * 5000)
    (local / "nested" / "rng_rank0.json").write_text("[1]")
    ckpt = f"{root}/attempt-2/checkpoint_00000004"

    def ray_like() -> None:
        fs.create_dir(f"{root}/attempt-2")
        with fs.open_output_stream(f"{root}/attempt-2/.validate_storage_marker"):
            pass
        with fs.open_output_stream(f"{root}/attempt-2/checkpoint_manager_snapshot.json") as f:
            f.write(b'{"latest": 4}')
        fs.create_dir(ckpt)
        pyarrow.fs.copy_files(str(local), ckpt, destination_filesystem=fs)
        info = fs.get_file_info([ckpt, f"{ckpt}/adapter_model.safetensors", f"{ckpt}/none"])
        assert [i.type for i in info] == [
            pyarrow.fs.FileType.Directory,
            pyarrow.fs.FileType.File,
            pyarrow.fs.FileType.NotFound,
        ]
        assert info[1].size == 5000
        children = fs.get_file_info(pyarrow.fs.FileSelector(f"{root}/attempt-2"))
        assert sorted(i.base_name for i in children) == [
            ".validate_storage_marker",
            "checkpoint_00000004",
            "checkpoint_manager_snapshot.json",
        ]
        with fs.open_input_stream(f"{root}/attempt-2/checkpoint_manager_snapshot.json") as f:
            assert f.read() == b'{"latest": 4}'
        pyarrow.fs.copy_files(ckpt, str(tmp_path / "down"), source_filesystem=fs)
        assert (tmp_path / "down" / "nested" / "rng_rank0.json").read_text() == "[1]"
        assert (tmp_path / "down" / "adapter_model.safetensors").read_bytes() == b"a" * 5000
        # Reading an earlier attempt's checkpoint (a resume) works; writing there does not.
        earlier = f"{root}/attempt-1/checkpoint_00000001"
        assert fs.get_file_info(earlier).type == pyarrow.fs.FileType.Directory
        with pytest.raises(StoreAccessRefused):
            fs.delete_dir(earlier)

    await blocking(ray_like)
    assert store.get_bytes(f"{ckpt}/nested/rng_rank0.json") == b"[1]"

    # Ray's controller and workers get the filesystem pickled: a fresh interpreter (no NATS
    # connection, no registry client yet) reads and prunes through it.
    script = (
        "import pickle, sys; fs = pickle.loads(sys.stdin.buffer.read()); "
        f"f = fs.open_input_stream({ckpt + '/nested/rng_rank0.json'!r}); "
        "sys.stdout.write(f.read().decode()); "
        f"fs.delete_dir({ckpt!r})"
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        input=pickle.dumps(fs),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"[1]"
    assert store.list(f"{ckpt}/") == []
    # The attempt token travels pickled, but is never shown in the store's repr (Ray logs).
    assert "token-a" not in repr(signed.access)


def test_an_unreachable_nats_is_unavailable_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarm_runtime.rpc import Unavailable
    from swarm_trainer import signed_store

    monkeypatch.setattr(signed_store, "UNAVAILABLE_RETRY_S", 0.5)
    monkeypatch.setattr(signed_store, "REQUEST_TIMEOUT_S", 1.0)
    access = SignedAccess(
        nats=Settings(nats_url="nats://127.0.0.1:1"),
        job_id="job-a",
        attempt=1,
        attempt_token=SecretStr("t"),
        worker_id="w",
    )
    with pytest.raises(Unavailable):
        SignedStore(access).get_bytes("datasets/t/x.jsonl")


async def test_a_short_store_outage_is_waited_out(settings: Settings, s3_server: S3Server) -> None:
    """The store refusing connections for 5 s (a restart, a blip): a read made meanwhile gets
    its bytes once the store is back, as with the keyed store (tests/runtime/
    test_store_outage.py), instead of failing the attempt."""
    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    flaky = FlakyProxy((host, int(port)))
    s3 = s3_settings(
        settings, dataclasses.replace(s3_server, endpoint=f"http://{host}:{flaky.port}")
    )
    store = open_store(s3)
    jobs = await seed_jobs(s3, store)
    app = build_app(s3)
    await app.start()
    signed = SignedStore(
        SignedAccess(
            nats=Settings(nats_url=s3.nats_url, namespace=s3.namespace),
            job_id="job-a",
            attempt=2,
            attempt_token=SecretStr("token-a"),
            worker_id="w",
        )
    )
    dataset = jobs.datasets["job-a"]

    def during_an_outage() -> bytes:
        with ThreadPoolExecutor(1) as pool:
            down = pool.submit(flaky.outage, 5.0)
            time.sleep(0.5)  # well inside it
            data = signed.get_bytes(dataset)
            down.result()
            return data

    try:
        assert await blocking(lambda: signed.get_bytes(dataset)) == b'{"text": "job-a data"}\n'
        assert await blocking(during_an_outage) == b'{"text": "job-a data"}\n'
    finally:
        await app.stop()
        flaky.close()

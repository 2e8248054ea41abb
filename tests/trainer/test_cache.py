"""The worker's cache of base models and datasets: hits, misses, LRU eviction at the size
limit, corrupt entries fetched again, and concurrent users."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm_contracts.layout import dataset_key
from swarm_runtime.dataset_codec import CorruptDataset
from swarm_runtime.store import LocalStore
from swarm_trainer import fetch
from swarm_trainer.cache import CacheError, TransferCache, keep_compiled_kernels
from swarm_trainer.data import read_jsonl
from swarm_trainer.fetch import DATASET_FILE

from .conftest import put_dataset, put_model

KB = 1024


class Source:
    """What ``fill`` downloads for a digest: one file of known bytes; counts the downloads."""

    def __init__(self) -> None:
        self.contents: dict[str, bytes] = {}
        self.fills: list[str] = []
        self.delay_s = 0.0

    def add(self, size: int, seed: int) -> str:
        data = hashlib.sha256(str(seed).encode()).digest() * (size // 32)
        digest = hashlib.sha256(data).hexdigest()
        self.contents[digest] = data
        return digest

    def fill(self, digest: str) -> Callable[[Path], None]:
        def write(directory: Path) -> None:
            self.fills.append(digest)
            time.sleep(self.delay_s)
            (directory / "blob").write_bytes(self.contents[digest])

        return write


def verify(digest: str) -> Callable[[Path], bool]:
    def check(directory: Path) -> bool:
        return hashlib.sha256((directory / "blob").read_bytes()).hexdigest() == digest

    return check


def use(cache: TransferCache, source: Source, digest: str) -> bool:
    """One use of the entry; whether it was a hit."""
    with cache.use("models", digest, source.fill(digest), verify(digest)) as entry:
        assert (entry.path / "blob").read_bytes() == source.contents[digest]
        return entry.hit


def test_a_miss_downloads_once_and_the_next_use_hits(tmp_path: Path) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=1 << 20), Source()
    a = source.add(4 * KB, 1)
    assert use(cache, source, a) is False
    assert use(cache, source, a) is True
    assert source.fills == [a]
    assert cache.entries("models") == [a]
    assert cache.entries("datasets") == []


def test_the_least_recently_used_entry_goes_first_at_the_size_limit(tmp_path: Path) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=10 * KB), Source()
    a, b, c = (source.add(4 * KB, seed) for seed in range(3))
    use(cache, source, a)
    use(cache, source, b)
    os.utime(cache.path("models", a), ns=(1, 1))
    os.utime(cache.path("models", b), ns=(2, 2))
    use(cache, source, a)  # a is now the most recent: b goes when c comes
    use(cache, source, c)
    assert cache.entries("models") == [c, a]
    assert cache.size() == 8 * KB
    assert not list((tmp_path / ".tmp").iterdir())
    assert use(cache, source, b) is False  # fetched again, and a goes
    assert cache.entries("models") == [b, c]


def test_an_entry_in_use_is_not_evicted(tmp_path: Path) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=0), Source()
    a, b = source.add(4 * KB, 1), source.add(4 * KB, 2)
    with cache.use("models", a, source.fill(a), verify(a)) as held:
        use(cache, source, b)
        # Over the limit, but a is in use: only b (no longer used) could go.
        assert cache.entries("models") == [a]
        assert (held.path / "blob").read_bytes() == source.contents[a]
    # Released: now it goes too.
    assert cache.entries("models") == []


def test_a_corrupt_entry_is_fetched_again_never_used(tmp_path: Path) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=1 << 20), Source()
    a = source.add(4 * KB, 1)
    use(cache, source, a)
    blob = cache.path("models", a) / "blob"
    blob.write_bytes(b"x" + source.contents[a][1:])  # same size, one byte off
    assert use(cache, source, a) is False  # `use` asserts the bytes it was handed
    assert source.fills == [a, a]
    assert use(cache, source, a) is True


def test_a_download_that_does_not_match_its_digest_fails_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=1 << 20), Source()
    a = source.add(4 * KB, 1)
    source.contents[a] = b"not what the digest says"
    with pytest.raises(CacheError, match="does not match"):
        use(cache, source, a)
    assert cache.entries("models") == []
    assert not list((tmp_path / ".tmp").iterdir())


def test_two_jobs_asking_at_once_share_one_download(tmp_path: Path) -> None:
    cache, source = TransferCache(tmp_path, max_bytes=0), Source()
    a = source.add(64 * KB, 1)
    source.delay_s = 0.3  # both ask while the first download runs
    both_in = threading.Barrier(2)
    hits: list[bool] = []
    errors: list[BaseException] = []

    def job() -> None:
        try:
            with cache.use("models", a, source.fill(a), verify(a)) as entry:
                hits.append(entry.hit)
                # Each holds the entry while the other uses it: with a limit of 0 bytes,
                # neither may evict it from under the other.
                both_in.wait(timeout=10)
                assert (entry.path / "blob").read_bytes() == source.contents[a]
                both_in.wait(timeout=10)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert source.fills == [a]
    assert sorted(hits) == [False, True]
    # The last to let go evicted it (a limit of 0 keeps nothing nobody uses).
    assert cache.entries("models") == []


def test_leftovers_of_a_dead_download_are_cleaned(tmp_path: Path) -> None:
    cache = TransferCache(tmp_path, max_bytes=1 << 20)
    stale = tmp_path / ".tmp" / f"models-{'a' * 64}-0123"
    stale.mkdir()
    (stale / "half").write_bytes(b"x")
    cache.evict()
    assert not stale.exists()


def test_a_key_must_be_a_sha256(tmp_path: Path) -> None:
    cache = TransferCache(tmp_path, max_bytes=0)
    for bad in ("../../etc", "a" * 64 + "\n", "A" * 64):
        with pytest.raises(ValueError, match="not a cache key"):
            cache.path("models", bad)


class CountingStore(LocalStore):
    """A real local store that counts the files handed out."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get_file(self, key: str, path: Path) -> None:
        self.gets.append(key)
        super().get_file(key, path)


def test_base_model_and_dataset_come_from_the_store_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = CountingStore(tmp_path / "store")
    cache = TransferCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = put_model(store, tiny_model_dir)
    info = put_dataset(store, [{"text": "hello"}])
    for _ in range(2):
        with fetch.base_model(cache, store, ref) as model, fetch.dataset(cache, store, info) as ds:
            assert (model.path / "config.json").is_file()
            assert (ds.path / DATASET_FILE).read_bytes() == b'{"text": "hello"}\n'
    model_gets = [k for k in store.gets if k.startswith(ref.store_key)]
    assert sorted(model_gets) == store.list(ref.store_key + "/")
    assert store.gets.count(dataset_key("default", info.sha256)) == 1
    assert cache.entries("models") == [ref.digest]


def test_a_model_whose_store_files_do_not_match_its_digest_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    cache = TransferCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = put_model(store, tiny_model_dir)
    store.put_bytes(f"{ref.store_key}/config.json", b"{}")
    with pytest.raises(CacheError), fetch.base_model(cache, store, ref):
        pass


@pytest.mark.parametrize("legacy_plain", [False, True], ids=["zstd", "plain (before zstd)"])
def test_a_dataset_is_cached_as_plain_jsonl_however_stored(
    tmp_path: Path, legacy_plain: bool
) -> None:
    store = CountingStore(tmp_path / "store")
    cache = TransferCache(tmp_path / "cache", max_bytes=1 << 30)
    records = [{"text": f"example {i}"} for i in range(1000)]
    info = put_dataset(store, records, legacy_plain=legacy_plain)
    stored = store.get_bytes(info.store_key)
    assert stored.startswith(b"\x28\xb5\x2f\xfd") is not legacy_plain
    with fetch.dataset(cache, store, info) as ds:
        data = (ds.path / DATASET_FILE).read_bytes()
    assert hashlib.sha256(data).hexdigest() == info.sha256
    assert read_jsonl(ds.path / DATASET_FILE) == records
    assert [p.name for p in ds.path.iterdir()] == [DATASET_FILE]  # nothing left over


def test_a_truncated_stored_dataset_is_an_error_and_not_cached(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    cache = TransferCache(tmp_path / "cache", max_bytes=1 << 30)
    info = put_dataset(store, [{"text": f"example {i} " * 50} for i in range(2000)])
    store.put_bytes(info.store_key, store.get_bytes(info.store_key)[:-100])
    with pytest.raises(CorruptDataset, match="ends early"), fetch.dataset(cache, store, info):
        pass
    assert cache.entries("datasets") == []


def test_compiled_kernels_are_kept_in_the_work_dir_unless_the_operator_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/operators/own/triton")
    keep_compiled_kernels(tmp_path / "work")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "work/compiled/inductor")
    assert os.environ["TRITON_CACHE_DIR"] == "/operators/own/triton"

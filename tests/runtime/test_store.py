"""The object store contract, run unchanged against every backend.

The same test functions run on ``LocalStore`` (a temp dir) and on ``S3Store`` against a real
S3-protocol HTTP server (``tests/conftest.py``'s ``s3_server``: MinIO when a ``minio`` binary
is on PATH, else moto's ``ThreadedMotoServer``). The S3 store is built through
``open_store`` so URL parsing is covered.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarm_contracts.layout import InvalidKey, validate_key
from swarm_runtime.settings import Settings
from swarm_runtime.store import LocalStore, NotFound, ObjectStore, S3Store, open_store, sha256_file

from ..conftest import S3Server


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = "swarm-" + uuid.uuid4().hex[:12]  # a fresh bucket per test
    s = open_store(
        Settings(
            store_url=f"s3://{bucket}?endpoint={server.endpoint}",
            s3_access_key=server.access_key,
            s3_secret_key=server.secret_key,
        )
    )
    assert isinstance(s, S3Store)
    assert s.bucket == bucket
    assert s.client.bucket_exists(bucket)  # open_store creates the bucket
    return s


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- bytes and files ----------------------------------------------------------------------


def test_put_get_bytes(store: ObjectStore) -> None:
    store.put_bytes("a/b/c.bin", b"\x00\x01binary\xff")
    assert store.get_bytes("a/b/c.bin") == b"\x00\x01binary\xff"
    store.put_bytes("a/b/c.bin", b"overwritten")
    assert store.get_bytes("a/b/c.bin") == b"overwritten"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""
    assert store.exists("empty")
    # Spaces, unicode and other URL-special characters are fine inside a segment.
    odd = "odd/a b+c=d&e%20ü@~.txt"
    store.put_bytes(odd, b"odd")
    assert store.get_bytes(odd) == b"odd"
    assert store.list("odd/") == [odd]
    assert store.sha256("a/b/c.bin") == _sha(b"overwritten")


def test_put_get_file(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(2 * 1024 * 1024 + 123)  # more than one read chunk
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store.put_file("files/src.bin", src)
    assert store.get_bytes("files/src.bin") == data
    assert store.sha256("files/src.bin") == _sha(data)

    dst = tmp_path / "out" / "deeper" / "dst.bin"  # parent dirs are created
    store.get_file("files/src.bin", dst)
    assert dst.read_bytes() == data

    dst.write_bytes(b"stale, longer than the new content" * 10)
    store.put_bytes("files/small", b"small")
    store.get_file("files/small", dst)  # overwrites, no stale tail
    assert dst.read_bytes() == b"small"


def test_exists(store: ObjectStore) -> None:
    assert not store.exists("x/y")
    store.put_bytes("x/y", b"1")
    assert store.exists("x/y")
    assert not store.exists("x")  # a "directory" is not an object
    assert not store.exists("x/y2")
    store.delete("x/y")
    assert not store.exists("x/y")


def test_byte_ranges(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put_bytes("d/big.bin", data)
    assert store.size("d/big.bin") == len(data)
    assert store.get_range("d/big.bin", 0, 10) == data[:10]
    assert store.get_range("d/big.bin", 1000, 4096) == data[1000:5096]
    # Short at the end, empty past it, empty for no length: as reading a file would be.
    assert store.get_range("d/big.bin", len(data) - 3, 100) == data[-3:]
    assert store.get_range("d/big.bin", len(data), 10) == b""
    assert store.get_range("d/big.bin", len(data) + 50, 10) == b""
    assert store.get_range("d/big.bin", 5, 0) == b""
    # Consecutive ranges put the object back together.
    parts = [store.get_range("d/big.bin", at, 777) for at in range(0, len(data), 777)]
    assert b"".join(parts) == data
    with pytest.raises(NotFound):
        store.get_range("d/missing", 0, 10)
    with pytest.raises(NotFound):
        store.get_range("d/missing", 0, 0)
    with pytest.raises(NotFound):
        store.size("d/missing")
    with pytest.raises(ValueError, match="byte range"):
        store.get_range("d/big.bin", -1, 10)


def test_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        store.get_bytes("missing/key")
    target = tmp_path / "target"
    with pytest.raises(NotFound):
        store.get_file("missing/key", target)
    assert not target.exists()
    with pytest.raises(NotFound):
        store.sha256("missing/key")
    with pytest.raises(NotFound):
        store.download_dir("missing/", tmp_path / "dl")
    store.put_bytes("dir/file", b"1")
    with pytest.raises(NotFound):
        store.get_bytes("dir")  # a prefix is not a key
    assert issubclass(NotFound, KeyError)
    store.delete("missing/key")  # deleting nothing is not an error


# --- listing ------------------------------------------------------------------------------

KEYS = ["z", "a/bcd", "ab/4", "a/b/2/x", "a/bc/3", "a/b/1", "a/b/2/y"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a/b/", ["a/b/1", "a/b/2/x", "a/b/2/y"]),
        ("a/b", ["a/b/1", "a/b/2/x", "a/b/2/y", "a/bc/3", "a/bcd"]),
        ("a/bc", ["a/bc/3", "a/bcd"]),
        ("a/b/2", ["a/b/2/x", "a/b/2/y"]),
        ("a/", ["a/b/1", "a/b/2/x", "a/b/2/y", "a/bc/3", "a/bcd"]),
        ("a", ["a/b/1", "a/b/2/x", "a/b/2/y", "a/bc/3", "a/bcd", "ab/4"]),
        ("z", ["z"]),
        ("a/b/1", ["a/b/1"]),
        ("nothing", []),
        ("nothing/", []),
        ("a/b/1/", []),
        ("z/", []),
    ],
)
def test_list_prefix_semantics(store: ObjectStore, prefix: str, expected: list[str]) -> None:
    for key in KEYS:
        store.put_bytes(key, key.encode())
    assert store.list(prefix) == expected


def test_list_is_sorted(store: ObjectStore) -> None:
    keys = [f"s/{n}" for n in ("b", "a", "c/2", "c/10", "B", "a0", "_")]
    for key in keys:
        store.put_bytes(key, b"")
    assert store.list("s/") == sorted(keys)


# --- deleting -----------------------------------------------------------------------------


def test_delete(store: ObjectStore) -> None:
    store.put_bytes("d/1", b"1")
    store.put_bytes("d/2", b"2")
    store.delete("d/1")
    assert store.list("d/") == ["d/2"]
    assert store.get_bytes("d/2") == b"2"


def test_delete_prefix(store: ObjectStore) -> None:
    for key in KEYS:
        store.put_bytes(key, b"x")
    store.delete_prefix("a/b/")
    assert store.list("a") == ["a/bc/3", "a/bcd", "ab/4"]
    store.delete_prefix("a/b")  # string-prefix semantics, like list
    assert store.list("a") == ["ab/4"]
    store.delete_prefix("nothing/")  # nothing to do is fine
    assert store.exists("z")


def test_key_reusable_after_its_directory_is_gone(store: ObjectStore) -> None:
    # On S3 "d" and "d/x" are unrelated keys; the local store must not keep "d/" around.
    store.put_bytes("d/x/y", b"1")
    store.delete("d/x/y")
    store.put_bytes("d", b"now a file")
    assert store.get_bytes("d") == b"now a file"
    store.put_bytes("e/x", b"1")
    store.delete_prefix("e/")
    store.put_bytes("e", b"2")
    assert store.list("e") == ["e"]


# --- directories --------------------------------------------------------------------------


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "adapter_config.json": b'{"r": 8}',
        "adapter_model.safetensors": os.urandom(70_000),
        "sub/dir/deep.txt": b"deep",
        "sub/empty": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "empty-dir").mkdir()  # empty dirs are not objects
    return files


@pytest.mark.parametrize("prefix", ["adapters/t/name/1", "adapters/t/name/1/"])
def test_upload_download_dir_round_trip(store: ObjectStore, tmp_path: Path, prefix: str) -> None:
    files = _make_tree(tmp_path / "src")
    store.put_bytes("adapters/t/name/10/other", b"sibling with a longer name")

    digests = store.upload_dir(tmp_path / "src", prefix)
    assert digests == {rel: _sha(data) for rel, data in files.items()}
    base = prefix.rstrip("/")
    assert store.list(base + "/") == sorted(f"{base}/{rel}" for rel in files)
    assert store.file_digests(prefix) == digests

    out = tmp_path / "out"
    paths = store.download_dir(prefix, out)
    assert sorted(paths) == sorted(out / rel for rel in files)
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data
        assert sha256_file(out / rel) == digests[rel]
    assert not (out / "other").exists()  # "…/1" did not pull in "…/10"


def test_copy_prefix_replaces_the_target_with_the_source_s_files(store: ObjectStore) -> None:
    store.put_bytes("src/a.txt", b"a")
    store.put_bytes("src/sub/b.txt", b"b")
    store.put_bytes("dst/stale.txt", b"left from an earlier copy")
    digests = store.copy_prefix("src", "dst")
    assert store.list("dst/") == ["dst/a.txt", "dst/sub/b.txt"]
    assert store.get_bytes("dst/sub/b.txt") == b"b"
    assert digests == store.file_digests("dst")
    with pytest.raises(NotFound):
        store.copy_prefix("gone", "dst")


def test_file_digests_of_missing_prefix_is_empty(store: ObjectStore) -> None:
    assert store.file_digests("nothing/here") == {}


# --- key validation -----------------------------------------------------------------------

BAD_KEYS = [
    "",
    "/abs",
    "/",
    "..",
    "../escape",
    "a/../../escape",
    "a/..",
    "./a",
    "a/./b",
    "a//b",
    "//a",
    "a\\b",
    "..\\escape",
    "a\x00b",
    "a\nb",
    "a\tb",
    "a\x1fb",
    "a\x7fb",
]
BAD_OBJECT_KEYS = [*BAD_KEYS, "a/", "a/b/"]  # an object key cannot end with '/'
BAD_PREFIXES = [*BAD_KEYS, "a//"]


def _key_calls(tmp_path: Path) -> dict[str, Callable[[ObjectStore, str], Any]]:
    src = tmp_path / "src.txt"
    src.write_text("x")
    return {
        "put_bytes": lambda s, k: s.put_bytes(k, b"x"),
        "put_file": lambda s, k: s.put_file(k, src),
        "get_bytes": lambda s, k: s.get_bytes(k),
        "get_file": lambda s, k: s.get_file(k, tmp_path / "dst"),
        "exists": lambda s, k: s.exists(k),
        "delete": lambda s, k: s.delete(k),
        "sha256": lambda s, k: s.sha256(k),
    }


def _prefix_calls(tmp_path: Path) -> dict[str, Callable[[ObjectStore, str], Any]]:
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    (tree / "f").write_text("x")
    return {
        "list": lambda s, p: s.list(p),
        "delete_prefix": lambda s, p: s.delete_prefix(p),
        "upload_dir": lambda s, p: s.upload_dir(tree, p),
        "download_dir": lambda s, p: s.download_dir(p, tmp_path / "dl"),
        "file_digests": lambda s, p: s.file_digests(p),
        "ray_storage": lambda s, p: s.ray_storage(p),
    }


def test_invalid_keys_rejected_by_every_method(store: ObjectStore, tmp_path: Path) -> None:
    store.put_bytes("a/b", b"keep")
    calls = _key_calls(tmp_path)
    for call in calls.values():
        for key in BAD_OBJECT_KEYS:
            with pytest.raises(InvalidKey):
                call(store, key)
    for call in _prefix_calls(tmp_path).values():
        for prefix in BAD_PREFIXES:
            with pytest.raises(InvalidKey):
                call(store, prefix)
    # Nothing was written or removed by the rejected calls.
    assert store.list("a/") == ["a/b"]
    assert store.get_bytes("a/b") == b"keep"
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "dst").exists()
    assert issubclass(InvalidKey, ValueError)


@pytest.mark.parametrize("key", ["a", "a/b", "a.b/c-d_e", "a/.hidden", "x/...", "ü/ß"])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key
    assert validate_key(key + "/", prefix=True) == key + "/"


def test_download_dir_never_escapes_target(store: ObjectStore, tmp_path: Path) -> None:
    """A key written by a foreign S3 client may hold '..'; download_dir must refuse it."""
    if not isinstance(store, S3Store):
        pytest.skip("only a foreign S3 client can write such a key")
    evil = "p/x/../../../escaped.txt"
    # The minio client refuses such names itself: send a raw (unsigned) PUT. moto takes it;
    # a server that refuses such names (MinIO does) is fine too.
    request = urllib.request.Request(
        f"{store.endpoint}/{store.bucket}/{evil}", data=b"evil", method="PUT"
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except OSError as exc:
        pytest.skip(f"server refused the key: {exc}")
    if evil not in [o.object_name for o in store.client.list_objects(store.bucket, "p/", True)]:
        pytest.skip("server normalised the key")
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(InvalidKey):
        store.download_dir("p/", out)
    assert not (tmp_path / "a" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()


# --- Ray Train storage --------------------------------------------------------------------


def test_ray_storage_is_usable(store: ObjectStore) -> None:
    import pyarrow.fs

    path, fs = store.ray_storage("checkpoints/job-1")
    if isinstance(store, S3Store):
        assert isinstance(fs, pyarrow.fs.S3FileSystem)
        assert path == f"{store.bucket}/checkpoints/job-1"
    else:
        assert fs is None  # Ray Train's default: the local filesystem
        assert os.path.isabs(path)
        fs = pyarrow.fs.LocalFileSystem()
    # What Ray Train does with it: make directories, write files, read them back.
    fs.create_dir(f"{path}/checkpoint_000001")
    with fs.open_output_stream(f"{path}/checkpoint_000001/state.bin") as f:
        f.write(b"weights")
    with fs.open_input_stream(f"{path}/checkpoint_000001/state.bin") as f:
        assert f.read() == b"weights"
    # ... and the store sees the same object under the matching key.
    key = "checkpoints/job-1/checkpoint_000001/state.bin"
    assert store.get_bytes(key) == b"weights"
    assert store.list("checkpoints/job-1/") == [key]
    # Deleting the prefix also removes the directory markers pyarrow may have made.
    store.delete_prefix("checkpoints/job-1/")
    if isinstance(store, S3Store):
        assert list(store.client.list_objects(store.bucket, "checkpoints/job-1", True)) == []
    assert store.list("checkpoints/") == []
    assert store.ray_storage("checkpoints/job-1/")[0] == path  # trailing '/' is the same


# --- local backend specifics --------------------------------------------------------------


def _all_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_local_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    src.write_bytes(b"file")
    store.put_bytes("a/b", b"1")
    store.put_bytes("a/b", b"2")
    store.put_file("a/c", src)
    _make_tree(tmp_path / "tree")
    store.upload_dir(tmp_path / "tree", "t")
    with pytest.raises(FileNotFoundError):
        store.put_file("a/missing", tmp_path / "does-not-exist")

    class Boom(Exception):
        pass

    def explode(f: Any) -> None:
        f.write(b"half")
        raise Boom

    with pytest.raises(Boom):
        store._write_atomically("a/b", explode)
    assert store.get_bytes("a/b") == b"2"  # the old content survives a failed write
    assert not store.exists("a/missing")
    assert _all_files(store.root) == sorted(["a/b", "a/c", *store.list("t/")])
    # get_file is atomic on the local side too.
    out = tmp_path / "out"
    out.mkdir()
    store.get_file("a/c", out / "c")
    assert _all_files(out) == ["c"]


def test_local_files_get_normal_permissions(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes("k", b"1")
    umask = os.umask(0)
    os.umask(umask)
    assert (store.root / "k").stat().st_mode & 0o777 == 0o666 & ~umask

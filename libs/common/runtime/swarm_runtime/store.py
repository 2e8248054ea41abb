"""The object store: one interface, a local-directory backend and an S3/MinIO backend.

Chosen by ``SWARM_STORE_URL``: ``file:///abs/path`` (or ``file://relative``) or
``s3://bucket?endpoint=http://host:9000``; an endpoint without a scheme (``host:9000``) uses
https unless ``&secure=0`` is given. Keys are '/'-separated relative paths, validated so that
no key can escape the store.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from swarm_contracts.layout import join_key, validate_key
from swarm_runtime.settings import Settings
from swarm_runtime.store_outage import OUTAGE_RETRIES, outage_tolerant_http

_CHUNK = 1024 * 1024
_TMP_PREFIX = ".tmp-"


class NotFound(KeyError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(files: dict[str, str]) -> str:
    """One digest for a set of files: sha256 over the sorted ``name:sha256`` lines."""
    return hashlib.sha256(
        "".join(f"{n}:{d}\n" for n, d in sorted(files.items())).encode()
    ).hexdigest()


class ObjectStore(ABC):
    url: str

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from byte ``start`` on: fewer at the object's end,
        none past it. What lets a reader take its share of a large object and no more."""

    @abstractmethod
    def stat_size(self, key: str) -> int | None:
        """The object's size in bytes; None when there is no such object."""

    def size(self, key: str) -> int:
        """The object's size in bytes (``NotFound`` when there is none)."""
        found = self.stat_size(key)
        if found is None:
            raise NotFound(key)
        return found

    def exists(self, key: str) -> bool:
        return self.stat_size(key) is not None

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key below ``prefix`` (recursive), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def sha256(self, key: str) -> str: ...

    @abstractmethod
    def ray_storage(self, key_prefix: str) -> tuple[str, Any]:
        """(storage_path, storage_filesystem) for Ray Train's RunConfig."""

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    def upload_dir(self, local_dir: Path, prefix: str) -> dict[str, str]:
        """Upload every file below ``local_dir``; return relative name -> sha256."""
        # Validate before join_key, which would quietly strip a leading '/'.
        validate_key(prefix, prefix=True)
        files: dict[str, str] = {}
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                rel = path.relative_to(local_dir).as_posix()
                self.put_file(join_key(prefix, rel), path)
                files[rel] = sha256_file(path)
        return files

    def download_dir(self, prefix: str, local_dir: Path) -> builtins.list[Path]:
        validate_key(prefix, prefix=True)
        base = prefix.rstrip("/") + "/"
        paths = []
        for key in self.list(base):
            # A key written by another S3 client may hold '..' segments: never let one
            # escape local_dir.
            rel = validate_key(key[len(base) :])
            target = Path(local_dir) / rel
            self.get_file(key, target)
            paths.append(target)
        if not paths:
            raise NotFound(prefix)
        return paths

    def copy_prefix(self, source: str, target: str) -> dict[str, str]:
        """Replace what is under ``target`` with a copy of ``source``'s files (through a local
        directory: works across every backend); return relative name -> sha256. NotFound when
        ``source`` has no files (e.g. pruned meanwhile)."""
        self.delete_prefix(target.rstrip("/") + "/")
        with tempfile.TemporaryDirectory() as tmp:
            self.download_dir(source, Path(tmp))
            return self.upload_dir(Path(tmp), target)

    def file_digests(self, prefix: str) -> dict[str, str]:
        base = validate_key(prefix, prefix=True).rstrip("/") + "/"
        return {key[len(base) :]: self.sha256(key) for key in self.list(base)}


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, key: str, *, prefix: bool = False) -> Path:
        return self.root / validate_key(key, prefix=prefix)

    @staticmethod
    def _write_file_atomically(target: Path, write: Any) -> None:
        # Readers never see half a file: write beside the target, then rename over it.
        # (open "xb", not mkstemp: the file gets the umask's mode, not 0600.)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as f:
                write(f)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_atomically(self, key: str, write: Any) -> None:
        self._write_file_atomically(self._path(key), write)

    def put_file(self, key: str, path: Path) -> None:
        def write(f: Any) -> None:
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    f.write(chunk)

        self._write_atomically(key, write)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomically(key, lambda f: f.write(data))

    def get_file(self, key: str, path: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)

        def write(f: Any) -> None:
            with open(src, "rb") as s:
                while chunk := s.read(_CHUNK):
                    f.write(chunk)

        self._write_file_atomically(Path(path), write)

    def get_bytes(self, key: str) -> bytes:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)
        return src.read_bytes()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        _check_range(start, length)
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)
        with open(src, "rb") as f:
            f.seek(start)
            return f.read(length)

    def stat_size(self, key: str) -> int | None:
        src = self._path(key)
        return src.stat().st_size if src.is_file() else None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix, prefix=True)
        # As in S3, a prefix is a plain string prefix: "a/b" matches "a/b/x" and "a/bc" alike,
        # so search from the directory holding the last segment, unless it ends with '/'.
        directory = base if prefix.endswith("/") else base.parent
        if not directory.is_dir():
            return []
        keys = []
        for p in directory.rglob("*"):
            if p.is_file() and not p.name.startswith(_TMP_PREFIX):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not path.is_file():
            return  # S3 semantics: deleting a missing key is not an error
        path.unlink(missing_ok=True)
        # Drop the directories left empty, so that S3-like sequences such as
        # put("d/x"), delete("d/x"), put("d") also work here.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def sha256(self, key: str) -> str:
        path = self._path(key)
        if not path.is_file():
            raise NotFound(key)
        return sha256_file(path)

    def ray_storage(self, key_prefix: str) -> tuple[str, Any]:
        return str(self._path(key_prefix, prefix=True)), None


class S3Store(ObjectStore):
    def __init__(
        self,
        bucket: str,
        endpoint: str,
        access_key: str | None,
        secret_key: str | None,
        region: str | None = None,
        public_endpoint: str | None = None,
    ) -> None:
        from minio import Minio

        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"S3 endpoint must be http(s)://host[:port], got {endpoint!r}")
        self.secure = parsed.scheme == "https"
        self.endpoint = endpoint
        self.bucket = bucket
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.client = Minio(
            parsed.netloc,
            access_key=access_key,
            secret_key=secret_key,
            secure=self.secure,
            region=region,
            http_client=outage_tolerant_http(),
        )
        self._signing_client: Minio | None = None
        if public_endpoint:
            public = urlparse(public_endpoint)
            if public.scheme not in ("http", "https") or not public.netloc:
                raise ValueError(
                    f"S3 public endpoint must be http(s)://host[:port], got {public_endpoint!r}"
                )
            # Presigning is local arithmetic given the region: this client never connects.
            self._signing_client = Minio(
                public.netloc,
                access_key=access_key,
                secret_key=secret_key,
                secure=public.scheme == "https",
                region=region or "us-east-1",
            )
        if not self.client.bucket_exists(bucket):
            from minio.error import S3Error

            try:
                self.client.make_bucket(bucket)
            except S3Error as exc:
                # Several services start at once: another one may have just created it.
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
        self.url = f"s3://{bucket}?endpoint={endpoint}"

    def put_file(self, key: str, path: Path) -> None:
        # S3 puts are atomic: an object is visible whole or not at all.
        self.client.fput_object(self.bucket, validate_key(key), str(path))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(self.bucket, validate_key(key), io.BytesIO(data), len(data))

    def _not_found(self, exc: Exception, key: str) -> Exception:
        from minio.error import S3Error

        if isinstance(exc, S3Error) and exc.code in ("NoSuchKey", "NoSuchObject"):
            return NotFound(key)
        return exc

    def get_file(self, key: str, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.fget_object(self.bucket, validate_key(key), str(path))
        except Exception as exc:
            raise self._not_found(exc, key) from exc

    def get_bytes(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(self.bucket, validate_key(key))
        except Exception as exc:
            raise self._not_found(exc, key) from exc
        return _read_whole(resp)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        from minio.error import S3Error

        _check_range(start, length)
        if length == 0:
            # minio reads a length of 0 as "to the end".
            self.size(key)
            return b""
        try:
            resp = self.client.get_object(
                self.bucket, validate_key(key), offset=start, length=length
            )
        except S3Error as exc:
            if exc.code == "InvalidRange":  # S3's answer to a start past the end
                self.size(key)  # NotFound when it is not the range but the object
                return b""
            raise self._not_found(exc, key) from exc
        return _read_whole(resp)

    def list(self, prefix: str) -> list[str]:
        validate_key(prefix, prefix=True)
        return sorted(
            o.object_name
            for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
            if o.object_name and not o.is_dir
        )

    def delete(self, key: str) -> None:
        self.client.remove_object(self.bucket, validate_key(key))

    def delete_prefix(self, prefix: str) -> None:
        # One batch request per 1000 keys, and also the empty "dir/" marker objects that
        # pyarrow's S3FileSystem (Ray Train storage) creates, which list() leaves out.
        from minio.deleteobjects import DeleteObject

        validate_key(prefix, prefix=True)
        objects = [
            DeleteObject(o.object_name)
            for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
            if o.object_name
        ]
        errors = list(self.client.remove_objects(self.bucket, objects)) if objects else []
        if errors:
            raise OSError(f"could not delete {len(errors)} objects below {prefix!r}: {errors[0]}")

    def sha256(self, key: str) -> str:
        try:
            resp = self.client.get_object(self.bucket, validate_key(key))
        except Exception as exc:
            raise self._not_found(exc, key) from exc
        h = hashlib.sha256()
        try:
            for chunk in resp.stream(_CHUNK):
                h.update(chunk)
        finally:
            resp.close()
            resp.release_conn()
        return h.hexdigest()

    # --- scoped access for workers without keys (the registry's signer) ------------------

    def presigned_url(self, method: str, key: str, expires: timedelta) -> str:
        """A URL good for ``method`` on ``key`` alone until ``expires`` passes: what a worker
        that holds no keys uses (``swarm_contracts.store_access``). Signed for
        ``public_endpoint`` when set (workers outside the cluster's network reach the store
        under another name: SigV4 signs the host)."""
        client = self._signing_client or self.client
        return client.get_presigned_url(method, self.bucket, validate_key(key), expires=expires)

    def stat_size(self, key: str) -> int | None:
        try:
            stat = self.client.stat_object(self.bucket, validate_key(key))
        except Exception as exc:
            if isinstance(self._not_found(exc, key), NotFound):
                return None
            raise
        return stat.size or 0

    def list_sized(self, prefix: str) -> builtins.list[tuple[str, int]]:
        """``list`` with each object's size."""
        validate_key(prefix, prefix=True)
        return sorted(
            (o.object_name, o.size or 0)
            for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
            if o.object_name and not o.is_dir
        )

    def ray_storage(self, key_prefix: str) -> tuple[str, Any]:
        import pyarrow.fs

        parsed = urlparse(self.endpoint)
        fs = pyarrow.fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=parsed.netloc,
            scheme=parsed.scheme or "http",
            region=self.region or "us-east-1",
            # Ray's checkpoint writes ride out a store outage like every other store call.
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=OUTAGE_RETRIES),
        )
        return f"{self.bucket}/{validate_key(key_prefix, prefix=True).rstrip('/')}", fs


def _check_range(start: int, length: int) -> None:
    if start < 0 or length < 0:
        raise ValueError(f"a byte range starts and runs at 0 or more, got {start}+{length}")


def _read_whole(resp: Any) -> bytes:
    """A minio response's body, its connection handed back to the pool however the read ends."""
    try:
        return resp.read()
    finally:
        resp.close()
        resp.release_conn()


def open_store(settings: Settings | None = None, url: str | None = None) -> ObjectStore:
    settings = settings or Settings()
    url = url or settings.store_url
    parsed = urlparse(url)
    if parsed.scheme == "file":
        # file:///abs/path -> /abs/path ; file://rel/path -> rel/path (relative to cwd).
        # Percent-escapes are decoded: Path.as_uri() writes a space as %20.
        return LocalStore(Path(unquote(parsed.netloc + parsed.path)))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"SWARM_STORE_URL {url!r} names no bucket")
        query = parse_qs(parsed.query)
        endpoint = query.get("endpoint", ["http://127.0.0.1:9000"])[0]
        if "://" not in endpoint:
            secure = query.get("secure", ["1"])[0].lower() not in ("0", "false", "no")
            endpoint = ("https://" if secure else "http://") + endpoint
        secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
        return S3Store(
            parsed.netloc,
            endpoint,
            settings.s3_access_key,
            secret,
            settings.s3_region,
            public_endpoint=settings.s3_public_endpoint,
        )
    raise ValueError(f"unsupported SWARM_STORE_URL {url!r}: use file://… or s3://bucket?endpoint=…")

"""An fsspec filesystem over an object store, for Ray Train's checkpoint storage.

Ray Train persists checkpoints through a pyarrow filesystem (``RunConfig.storage_filesystem``,
``Checkpoint.filesystem``). A store without keys (``signed_store.SignedStore``) has no
pyarrow S3 filesystem to offer, so it offers ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))``
over this: keys as paths, directories implied by the keys below them (as in S3), every
operation one of the store's own. Ray uses: create_dir (nothing to do), get_file_info (head,
else a listing), recursive listings and streams for ``copy_files`` (checkpoint upload and
download), output streams (its snapshot and storage marker) and delete_dir (pruning old
checkpoints). Whole-object reads and writes: a checkpoint's files are read and written whole
anyway.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import Any, Protocol

from fsspec import AbstractFileSystem

from swarm_runtime.store import NotFound


class SizedStore(Protocol):
    """What the filesystem needs of a store: its operations, plus sizes for file infos."""

    def list_sized(self, prefix: str) -> list[tuple[str, int]]: ...

    def stat_size(self, key: str) -> int | None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def put_file(self, key: str, path: Path) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


def _file(name: str, size: int) -> dict[str, Any]:
    return {"name": name, "size": size, "type": "file"}


def _directory(name: str) -> dict[str, Any]:
    return {"name": name, "size": 0, "type": "directory"}


class StoreFileSystem(AbstractFileSystem):
    protocol = "swarm-store"
    root_marker = ""
    # Pickled to Ray's processes with the store it wraps; no instance cache to go stale.
    cachable = False

    def __init__(self, store: SizedStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        if text.startswith(f"{cls.protocol}://"):
            text = text[len(cls.protocol) + 3 :]
        return text.strip("/")

    def _below(self, path: str) -> list[tuple[str, int]]:
        return self.store.list_sized(path + "/") if path else []

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path and (size := self.store.stat_size(path)) is not None:
            return _file(path, size)
        if self._below(path):
            return _directory(path)
        raise FileNotFoundError(path)

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        entries: dict[str, dict[str, Any]] = {}
        for key, size in self._below(path):
            head, sep, _ = key[len(path) + 1 :].partition("/")
            name = f"{path}/{head}"
            entries[name] = _directory(name) if sep else _file(name, size)
        if not entries:
            entries[path] = self.info(path)  # a file lists as itself; nothing: not found
        found = sorted(entries.values(), key=lambda e: e["name"])
        return found if detail else [e["name"] for e in found]

    def find(
        self,
        path: Any,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        # One listing for the whole tree, not one per directory as fsspec's walk would make.
        path = self._strip_protocol(path)
        found: dict[str, dict[str, Any]] = {}
        for key, size in self._below(path):
            parts = key[len(path) + 1 :].split("/")
            if maxdepth is not None and len(parts) > maxdepth:
                if withdirs:
                    name = "/".join([path, *parts[:maxdepth]])
                    found[name] = _directory(name)
                continue
            found[key] = _file(key, size)
            if withdirs:
                for depth in range(1, len(parts)):
                    name = "/".join([path, *parts[:depth]])
                    found[name] = _directory(name)
        if not found and path and (own := self.store.stat_size(path)) is not None:
            found[path] = _file(path, own)
        elif found and withdirs:
            found[path] = _directory(path)
        ordered = dict(sorted(found.items()))
        return ordered if detail else list(ordered)

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        pass  # directories are implied by the keys below them

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        pass

    def rmdir(self, path: Any) -> None:
        pass

    def rm_file(self, path: Any) -> None:
        self.store.delete(self._strip_protocol(path))

    def rm(
        self, path: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        paths = path if isinstance(path, list) else [path]
        for p in map(self._strip_protocol, paths):
            if recursive:
                for key, _ in self._below(p):
                    self.store.delete(key)
            if self.store.stat_size(p) is not None:
                self.store.delete(p)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        data = self.store.get_bytes(self._strip_protocol(path1))
        self.store.put_bytes(self._strip_protocol(path2), data)

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        key = self._strip_protocol(path)
        if mode == "rb":
            try:
                return io.BytesIO(self.store.get_bytes(key))
            except NotFound as exc:
                raise FileNotFoundError(key) from exc
        if mode == "wb":
            return _UploadOnClose(self.store, key)
        raise NotImplementedError(f"{type(self).__name__} opens {mode!r}: only rb and wb")


class _UploadOnClose(io.FileIO):
    """A local temporary file that becomes the object when closed (S3 objects are written
    whole); one dropped without a close, as on an error, uploads nothing."""

    def __init__(self, store: SizedStore, key: str) -> None:
        fd, name = tempfile.mkstemp(prefix="swarm-upload-")
        super().__init__(fd, "wb", closefd=True)
        self._tmp = Path(name)
        self._store = store
        self._key = key
        self._upload = True

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            if self._upload:
                self._store.put_file(self._key, self._tmp)
        finally:
            self._tmp.unlink(missing_ok=True)

    def __del__(self) -> None:
        self._upload = False
        with contextlib.suppress(Exception):
            self.close()

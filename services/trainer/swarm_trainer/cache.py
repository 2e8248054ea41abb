"""The worker's cache of downloaded files, by content digest, with a size limit and LRU eviction.

Layout under the cache directory (``SWARM_TRAINER_CACHE_DIR``)::

    models/<digest>/...          one entry: a directory, filled once and never changed after
    datasets/<sha256>/...
    tokens/<entry>/...           tokenized frames of a token-cache entry (``token_cache``),
                                 kept to a quarter of the limit by their own LRU
    .locks/<kind>-<digest>.fill  held (exclusive) while the entry is downloaded or evicted
    .locks/<kind>-<digest>.use   held (shared) by every job using the entry, for as long as
                                 it runs; eviction takes it exclusive without waiting
    .tmp/                        downloads in progress, entries on their way out

An entry is downloaded into ``.tmp`` and renamed into place whole, so a reader never sees half
of one; it is hashed again on every use (``verify``) and fetched anew when it does not match,
never used. The ``.fill`` lock makes the ranks and jobs of one machine download an entry once;
the ``.use`` lock keeps an entry in use from being evicted, so the cache may exceed its limit
while the jobs holding it run. Recency is the entry directory's modification time, set on
each use.

The locks are ``flock`` locks on open files (one per ``open``), so they work between the Ray
workers' processes and between threads alike, and die with their process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from swarm_trainer.settings import TrainerSettings

log = logging.getLogger(__name__)

Kind = Literal["models", "datasets"]
KINDS: tuple[Kind, ...] = ("models", "datasets")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_LOCKS, _TMP = ".locks", ".tmp"
# Another process may fill, repair or evict an entry between two looks at it; each round
# makes progress, so running out of rounds means something keeps breaking the entry.
_ROUNDS = 5


def keep_compiled_kernels(work_dir: Path) -> None:
    """Keep torch.compile's and Triton's caches in the worker's work directory, for the ranks
    (Ray's workers inherit this process's environment). Flex attention's block mask and
    kernels are compiled on a rank's first step: over two minutes on a cold H200 (measured,
    docs/performance.md), seconds once cached. The default, /tmp, is lost with a container;
    an operator's own setting wins."""
    compiled = Path(work_dir).resolve() / "compiled"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compiled / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(compiled / "triton"))


class CacheError(RuntimeError):
    pass


class CacheSettings(BaseModel):
    """Where the cache is and how big it may grow (what the ranks need of the settings)."""

    model_config = ConfigDict(frozen=True)

    dir: Path
    max_bytes: int

    @classmethod
    def of(cls, settings: TrainerSettings) -> CacheSettings:
        # Absolute: the Ray workers do not run in the agent's working directory.
        directory = settings.trainer_cache_dir or Path(settings.work_dir) / "cache"
        return cls(dir=directory.resolve(), max_bytes=settings.trainer_cache_max_bytes)

    def open(self) -> TransferCache:
        return TransferCache(self.dir, self.max_bytes)


@dataclass(frozen=True)
class Entry:
    path: Path
    hit: bool  # found in the cache and verified; False: downloaded for this use


class TransferCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        for sub in (*KINDS, _LOCKS, _TMP):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def path(self, kind: Kind, digest: str) -> Path:
        if kind not in KINDS or not _DIGEST.fullmatch(digest):
            # Both become path components: only a plain sha256 may.
            raise ValueError(f"not a cache key: {kind}/{digest}")
        return self.root / kind / digest

    @contextlib.contextmanager
    def use(
        self,
        kind: Kind,
        digest: str,
        fill: Callable[[Path], None],
        verify: Callable[[Path], bool],
    ) -> Iterator[Entry]:
        """The entry ``kind/digest``, verified, held until the block ends.

        ``fill(directory)`` downloads the entry's files into an empty directory; ``verify``
        says whether a directory holds exactly what ``digest`` names. A fresh download that
        does not verify raises ``CacheError`` (the source itself is wrong)."""
        use_lock, hit = self._acquire(kind, digest, fill, verify)
        try:
            entry = self.path(kind, digest)
            os.utime(entry)  # most recently used
            self._evict_quietly()
            yield Entry(entry, hit)
        finally:
            os.close(use_lock)
        # What no job holds any more may go now (all of it, with a limit of 0).
        self._evict_quietly()

    def _acquire(
        self,
        kind: Kind,
        digest: str,
        fill: Callable[[Path], None],
        verify: Callable[[Path], bool],
    ) -> tuple[int, bool]:
        """(the entry's ``.use`` lock, held shared; whether it was a hit)."""
        entry = self.path(kind, digest)
        for _ in range(_ROUNDS):
            use_lock = self._lock(kind, digest, "use", fcntl.LOCK_SH)
            try:
                seen = _identity(entry)
                good = seen is not None and verify(entry)
            except BaseException:
                os.close(use_lock)
                raise
            if good:
                return use_lock, True
            os.close(use_lock)
            if seen is not None:
                log.warning(
                    "cache entry %s/%s does not match its digest: fetching it again", kind, digest
                )
            fill_lock = self._lock(kind, digest, "fill", fcntl.LOCK_EX)
            try:
                if _identity(entry) != seen:
                    continue  # filled or repaired while we waited: verify that one
                self._fill(kind, digest, fill, verify)
                # Held before the fill lock goes, so no eviction comes in between.
                return self._lock(kind, digest, "use", fcntl.LOCK_SH), False
            finally:
                os.close(fill_lock)
        raise CacheError(f"cache entry {kind}/{digest} kept changing while it was fetched")

    def _fill(
        self,
        kind: Kind,
        digest: str,
        fill: Callable[[Path], None],
        verify: Callable[[Path], bool],
    ) -> None:
        entry = self.path(kind, digest)
        tmp = self.root / _TMP / f"{kind}-{digest}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            fill(tmp)
            if not verify(tmp):
                raise CacheError(f"downloaded {kind}/{digest} does not match its digest")
            if _identity(entry) is not None:
                # A corrupt entry: moved aside rather than changed in place, so a job still
                # reading it keeps its open files, and a new open finds the good copy.
                self._discard(entry)
            os.rename(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _discard(self, entry: Path) -> None:
        trash = self.root / _TMP / f"trash-{uuid.uuid4().hex}"
        os.rename(entry, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _lock(self, kind: Kind, digest: str, what: str, mode: int) -> int:
        """An open lock file's descriptor, locked (``mode`` may include ``LOCK_NB``, then
        ``BlockingIOError`` when it is taken); closing the descriptor unlocks it."""
        fd = os.open(self.root / _LOCKS / f"{kind}-{digest}.{what}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # --- what is held, and eviction ------------------------------------------------------

    def entries(self, kind: Kind) -> list[str]:
        """The digests of ``kind`` held, most recently used first."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for item in os.scandir(self.root / kind):
                if _DIGEST.fullmatch(item.name):
                    with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                        found.append((item.stat().st_mtime_ns, item.name))
        return [digest for _, digest in sorted(found, reverse=True)]

    def size(self) -> int:
        return sum(_size(self.root / kind / d) for kind in KINDS for d in self.entries(kind))

    def evict(self) -> list[str]:
        """Drop least recently used entries until the cache is within ``max_bytes``, skipping
        the ones in use or being filled; return the dropped ones as ``kind/digest``."""
        self._clean_tmp()
        candidates = sorted(
            (_mtime(self.root / kind / d), kind, d) for kind in KINDS for d in self.entries(kind)
        )
        sizes = {(kind, d): _size(self.root / kind / d) for _, kind, d in candidates}
        total = sum(sizes.values())
        dropped = []
        for _, kind, digest in candidates:
            if total <= self.max_bytes:
                break
            if self._evict(kind, digest):
                total -= sizes[(kind, digest)]
                dropped.append(f"{kind}/{digest}")
        if dropped:
            log.info("cache: evicted %s", ", ".join(dropped))
        return dropped

    def _evict_quietly(self) -> None:
        # Keeping to the limit is housekeeping: a failure (a full or read-only disk, say) must
        # not fail the job that happened to be the one to look.
        try:
            self.evict()
        except OSError:
            log.warning("cache: eviction failed", exc_info=True)

    def _evict(self, kind: Kind, digest: str) -> bool:
        try:
            fill_lock = self._lock(kind, digest, "fill", fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            use_lock = self._lock(kind, digest, "use", fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fill_lock)
            return False
        try:
            entry = self.path(kind, digest)
            if _identity(entry) is None:
                return False
            self._discard(entry)
            return True
        finally:
            os.close(use_lock)
            os.close(fill_lock)

    def _clean_tmp(self) -> None:
        """Leftovers of a process that died mid-download (its fill lock died with it) or
        mid-eviction."""
        for item in os.scandir(self.root / _TMP):
            name, _, rest = item.name.partition("-")
            digest = rest.rsplit("-", 1)[0]
            kind = next((k for k in KINDS if k == name), None)
            if kind is not None and _DIGEST.fullmatch(digest):
                try:
                    fill_lock = self._lock(kind, digest, "fill", fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being downloaded
                os.close(fill_lock)
            shutil.rmtree(item.path, ignore_errors=True)


def _identity(path: Path) -> tuple[int, int] | None:
    """Which directory is at ``path`` now (a repair or a new fill puts another there)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total

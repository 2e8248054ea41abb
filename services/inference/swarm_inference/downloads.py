"""Files from the object store into a local cache directory, each checked against its sha256."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from swarm_contracts.layout import join_key, validate_key
from swarm_runtime.store import ObjectStore, sha256_file

# Never fetched: pickle files can run code when loaded, and nothing here needs them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class DownloadError(RuntimeError):
    pass


def fetch_verified(
    store: ObjectStore,
    prefix: str,
    files: Mapping[str, str],
    directory: Path,
    only: Iterable[str] | None = None,
) -> Path:
    """Make ``directory`` hold ``files`` (name -> sha256, the registry's record) from
    ``prefix``: a file already there with the right digest is kept, others are downloaded
    and checked. ``only`` limits which of ``files`` are fetched."""
    wanted = [n for n in files if only is None or n in set(only)]
    directory.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        validate_key(name)  # a recorded name never escapes the directory
        if name.lower().endswith(PICKLE_SUFFIXES):
            continue
        target = directory / name
        expected = files[name]
        if target.is_file() and sha256_file(target) == expected:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(join_key(prefix, name), target)
        actual = sha256_file(target)
        if actual != expected:
            target.unlink(missing_ok=True)
            raise DownloadError(
                f"{prefix}/{name}: sha256 {actual[:12]}… does not match the registry's "
                f"{expected[:12]}…"
            )
    return directory

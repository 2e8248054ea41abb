"""What a rank takes from the store through the worker's cache: the base model and the datasets.

Both are content-addressed by what the registry and the gateway recorded: a base model by its
tree digest (``ModelRef.digest``: sha256 over the sorted ``name:sha256`` lines of its files),
a dataset by the sha256 of its one (decompressed) JSONL file. An entry counts as that content
only if its files hash to it, checked on every use (see ``cache``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import ModelRef
from swarm_runtime.dataset_codec import fetch_jsonl
from swarm_runtime.store import ObjectStore, sha256_file, tree_digest
from swarm_trainer.cache import Entry, TransferCache

DATASET_FILE = "data.jsonl"


def local_digests(directory: Path) -> dict[str, str]:
    """Relative name -> sha256 of every file below ``directory`` (as the registry records)."""
    return {
        path.relative_to(directory).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def is_model(digest: str) -> Callable[[Path], bool]:
    def verify(directory: Path) -> bool:
        return tree_digest(local_digests(directory)) == digest

    return verify


def is_dataset(sha256: str) -> Callable[[Path], bool]:
    def verify(directory: Path) -> bool:
        names = [p.name for p in directory.iterdir()]
        return names == [DATASET_FILE] and sha256_file(directory / DATASET_FILE) == sha256

    return verify


@contextlib.contextmanager
def base_model(cache: TransferCache, store: ObjectStore, ref: ModelRef) -> Iterator[Entry]:
    """The model's ``from_pretrained`` directory, held until the block ends."""

    def fill(directory: Path) -> None:
        store.download_dir(ref.store_key, directory)

    with cache.use("models", ref.digest, fill, is_model(ref.digest)) as entry:
        yield entry


@contextlib.contextmanager
def dataset(cache: TransferCache, store: ObjectStore, info: DatasetInfo) -> Iterator[Entry]:
    """An entry whose ``path / DATASET_FILE`` is the dataset's JSONL, held until the block
    ends."""

    def fill(directory: Path) -> None:
        # The cache holds plain JSONL (what ``info.sha256`` is of) however the store keeps it.
        fetch_jsonl(store, info.store_key, directory / DATASET_FILE)

    with cache.use("datasets", info.sha256, fill, is_dataset(info.sha256)) as entry:
        yield entry

"""The weights a job starts from: the parent adapter it continues (``from_adapter``), or the
adapter of the checkpoint it forks (``from_checkpoint``); fetched, checked and loaded.

The scheduler pinned either (``Assignment.parent``, ``Assignment.fork``) with the sha256 of
each of its files as the registry recorded them. Only the PEFT config and the safetensors
weights are fetched, so nothing that could be unpickled ever reaches
``PeftModel.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from swarm_contracts.jobs import ForkPoint, ParentAdapter
from swarm_contracts.layout import join_key
from swarm_contracts.workers import Assignment
from swarm_runtime.store import ObjectStore, sha256_file

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PARENT_FILES = (CONFIG_FILE, WEIGHTS_FILE)


class ParentAdapterError(RuntimeError):
    pass


def missing_parent_files(store: ObjectStore, parent: ParentAdapter) -> list[str]:
    """What a run would fail to fetch: checked before any Ray worker starts."""
    return [
        name
        for name in PARENT_FILES
        if name not in parent.files or not store.exists(join_key(parent.store_key, name))
    ]


def missing_fork_files(store: ObjectStore, fork: ForkPoint) -> list[str]:
    return [
        name
        for name in PARENT_FILES
        if name not in fork.files or not store.exists(join_key(fork.store_key, name))
    ]


def starting_adapter(store: ObjectStore, job: Assignment, directory: Path) -> Path | None:
    """The adapter the job's weights start from, downloaded and checked (None: a fresh LoRA).
    A resumed attempt then loads its checkpoint's weights over them."""
    if job.parent is not None:
        return fetch_parent(store, job.parent, directory)
    if job.fork is not None:
        what = f"from_checkpoint {job.fork.ref}"
        return _fetch(store, job.fork.store_key, job.fork.files, directory, what)
    return None


def fetch_parent(store: ObjectStore, parent: ParentAdapter, directory: Path) -> Path:
    """Download the parent's PEFT files into ``directory``, each verified against its sha256."""
    return _fetch(store, parent.store_key, parent.files, directory, f"parent adapter {parent.ref}")


def _fetch(
    store: ObjectStore, store_key: str, files: dict[str, str], directory: Path, what: str
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in PARENT_FILES:
        expected = files.get(name)
        if expected is None:
            raise ParentAdapterError(f"{what} has no {name}")
        target = directory / name
        store.get_file(join_key(store_key, name), target)
        if sha256_file(target) != expected:
            raise ParentAdapterError(f"{what}: {name} does not match its recorded sha256")
    return directory


def load_parent(base: PreTrainedModel, directory: Path, dropout: float) -> PeftModel:
    """The parent adapter on ``base``, trainable. Its own config gives the LoRA shape (rank,
    alpha, target modules); dropout is a training setting, so it is the job's."""
    from peft import LoraConfig, PeftModel  # on the ranks only: the agent checks files here

    config = LoraConfig.from_pretrained(str(directory))
    config.lora_dropout = dropout
    return PeftModel.from_pretrained(base, directory, is_trainable=True, config=config)

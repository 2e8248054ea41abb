"""Continuing training (``from_adapter``): the parent adapter, fetched, checked and loaded.

The scheduler pinned the parent (``Assignment.parent``) with the sha256 of each of its files as
the registry recorded them. Only the PEFT config and the safetensors weights are fetched, so
nothing that could be unpickled ever reaches ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

from peft import LoraConfig, PeftModel
from transformers import PreTrainedModel

from swarm_contracts.jobs import ParentAdapter
from swarm_contracts.layout import join_key
from swarm_runtime.store import ObjectStore, sha256_file

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


def fetch_parent(store: ObjectStore, parent: ParentAdapter, directory: Path) -> Path:
    """Download the parent's PEFT files into ``directory``, each verified against its sha256."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in PARENT_FILES:
        expected = parent.files.get(name)
        if expected is None:
            raise ParentAdapterError(f"parent adapter {parent.ref} has no {name}")
        target = directory / name
        store.get_file(join_key(parent.store_key, name), target)
        if sha256_file(target) != expected:
            raise ParentAdapterError(
                f"parent adapter {parent.ref}: {name} does not match its registered sha256"
            )
    return directory


def load_parent(base: PreTrainedModel, directory: Path, dropout: float) -> PeftModel:
    """The parent adapter on ``base``, trainable. Its own config gives the LoRA shape (rank,
    alpha, target modules); dropout is a training setting, so it is the job's."""
    config = LoraConfig.from_pretrained(str(directory))
    config.lora_dropout = dropout
    return PeftModel.from_pretrained(base, directory, is_trainable=True, config=config)

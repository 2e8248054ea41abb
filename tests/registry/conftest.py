"""A running registry app and a plain nats-py client per test."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from swarm_contracts.subjects import Subjects
from swarm_registry import build_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, open_store


def safetensors_bytes(shapes: dict[str, list[int]]) -> bytes:
    """A valid F32 safetensors file, written by hand to keep the tests free of torch."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


class RegistryClient:
    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects

    async def call(self, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        msg = await self.nc.request(
            self.subjects.registry(action), json.dumps(body or {}).encode(), timeout=10
        )
        return json.loads(msg.data)


@pytest.fixture
def store(settings: Settings) -> ObjectStore:
    return open_store(settings)


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[None]:
    app = build_app(settings)
    await app.start()
    yield
    await app.stop()


@pytest.fixture
async def client(settings: Settings, registry: None) -> AsyncIterator[RegistryClient]:
    nc = await nats.connect(settings.nats_url)
    yield RegistryClient(nc, Subjects(settings.namespace))
    await nc.close()


CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()


class ModelFiles:
    """Writes small but valid model directories into the store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def safetensors(self, shapes: dict[str, list[int]]) -> bytes:
        return safetensors_bytes(shapes)

    def upload(self, prefix: str, extra: dict[str, bytes] | None = None) -> None:
        files = {
            "config.json": CONFIG,
            "model.safetensors": safetensors_bytes({"w": [4, 3], "b": [3]}),
            "tokenizer.json": b'{"model": {}}',
            **(extra or {}),
        }
        for name, data in files.items():
            self.store.put_bytes(f"{prefix}/{name}", data)


@pytest.fixture
def model_files(store: ObjectStore) -> ModelFiles:
    return ModelFiles(store)

"""Base models: content-addressed versions of HF ``from_pretrained`` directories."""

from __future__ import annotations

import asyncio

from nats.js.kv import KeyValue

from swarm_contracts.memory import ModelShape
from swarm_contracts.registry import GetModel, ModelVersion, RegisterModel
from swarm_registry.errors import RegistryError
from swarm_registry.inspection import inspect_model
from swarm_registry.versions import (
    CAS_RETRIES,
    Versions,
    check_name,
    latest_key,
    raise_to,
    version_key,
)
from swarm_runtime.store import ObjectStore


class ModelCatalog:
    def __init__(self, kv: KeyValue, store: ObjectStore) -> None:
        self.versions: Versions[ModelVersion] = Versions(kv, ModelVersion)
        self.store = store

    async def register(self, request: RegisterModel) -> ModelVersion:
        name = check_name(request.name, "model name")
        found = await asyncio.to_thread(inspect_model, self.store, request.store_key)
        for _ in range(CAS_RETRIES):
            existing = [record for _, _, record in await self.versions.all(name)]
            # Same files as any version (not only the latest: v1, v2, then v1's files again
            # is v1): re-registering is a no-op, not a new version.
            for record in existing:
                if record.digest == found.digest:
                    return await self._with_shape(record, found.shape)
            latest = await self.versions.latest(name)
            version = (latest.version if latest else 0) + 1
            record = ModelVersion(
                name=name,
                version=version,
                store_key=found.store_key,
                files=found.files,
                digest=found.digest,
                architecture=found.architecture,
                parameter_count=found.parameter_count,
                tokenizer=found.tokenizer,
                hf_id=request.hf_id,
                modules=list(found.modules),
                shape=found.shape,
            )
            # KV create on the version key: of two racing registrations exactly one gets it;
            # the other re-reads (and may then find its own files already registered).
            if await self.versions.create(name, version, record):
                await raise_to(self.versions.kv, latest_key(name), version)
                return record
        raise RegistryError(
            f"model {name!r}: too many concurrent registrations, try again", "conflict"
        )

    async def _with_shape(self, record: ModelVersion, shape: ModelShape | None) -> ModelVersion:
        """A version registered before the registry kept architecture numbers gets them when
        its files are registered again (the files, and so the numbers, are the same)."""
        if record.shape is not None or shape is None:
            return record
        record = record.model_copy(update={"shape": shape})
        await self.versions.table.put(version_key(record.name, record.version), record)
        return record

    async def get(self, request: GetModel) -> ModelVersion:
        name = check_name(request.name, "model name")  # a KV key token: refused, not a 500
        if request.version is None:
            record = await self.versions.latest(name)
        else:
            record = await self.versions.get(name, request.version)
        if record is None:
            suffix = f" version {request.version}" if request.version is not None else ""
            raise RegistryError(f"unknown model {name!r}{suffix}", "not_found")
        return record

    async def list(self) -> list[ModelVersion]:
        return [record for _, _, record in await self.versions.all()]

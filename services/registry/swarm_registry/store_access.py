"""The store signer: scoped, short-lived store access for workers that hold no store keys.

A provider's agent asks ``swarm.registry.store.access`` for each operation with its
assignment's attempt token. The registry holds the store's keys and the job records (it fences
adapter registrations the same way), so it can tell whether the asker runs the job's current
attempt and whether the key lies in that attempt's scope (``swarm_contracts.store_access``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import JobRecord, JobState, utcnow
from swarm_contracts.layout import InvalidKey, validate_key
from swarm_contracts.providers import token_matches
from swarm_contracts.store_access import (
    StoreAccess,
    StoredObject,
    StoreGrant,
    job_scope,
)
from swarm_registry.errors import RegistryError
from swarm_runtime.records import RecordTable
from swarm_runtime.store import ObjectStore, S3Store

# Long enough for one object of a large base model over a slow link, short enough that a URL
# that leaks is soon worthless; a URL names one object and one method.
URL_LIFETIME = timedelta(minutes=15)
_METHODS = {"get": "GET", "put": "PUT", "delete": "DELETE"}
# The attempt may still use the store while it is running (or about to): a job that ended
# or moved on has nothing more to read or write.
_ACTIVE = (JobState.assigned, JobState.running)


class StoreSigner:
    def __init__(
        self,
        store: ObjectStore,
        jobs: RecordTable[JobRecord],
        datasets: RecordTable[DatasetInfo],
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.datasets = datasets

    async def access(self, request: StoreAccess, worker_id: str) -> StoreGrant:
        """Grant one operation to ``worker_id`` (the sender, from its request's subject) if it
        holds the job's current attempt and the key is in that attempt's scope."""
        if not isinstance(self.store, S3Store):
            raise RegistryError(
                "scoped store access needs an S3 store (this registry's is "
                f"{self.store.url}): give the worker store keys instead",
                "invalid",
            )
        store = self.store
        try:
            validate_key(request.key, prefix=request.op == "list")
        except InvalidKey as exc:
            raise RegistryError(str(exc), "invalid") from exc
        record = await self._current(request, worker_id)
        datasets = await self._dataset_keys(record)
        if not job_scope(record, datasets).allows(request.op, request.key):
            raise RegistryError(
                f"{request.op} {request.key!r} is outside job {request.job_id!r} attempt "
                f"{request.attempt}'s scope",
                "forbidden",
            )
        if request.op == "list":
            listed = await asyncio.to_thread(store.list_sized, request.key)
            objects = [StoredObject(key=k, size=n) for k, n in listed]
            return StoreGrant(op="list", key=request.key, objects=objects)
        if request.op == "head":
            size = await asyncio.to_thread(store.stat_size, request.key)
            found = [] if size is None else [StoredObject(key=request.key, size=size)]
            return StoreGrant(op="head", key=request.key, objects=found)
        method = _METHODS[request.op]
        url = store.presigned_url(method, request.key, URL_LIFETIME)
        return StoreGrant(
            op=request.op,
            key=request.key,
            method=method,
            url=url,
            expires_at=utcnow() + URL_LIFETIME,
        )

    async def _current(self, request: StoreAccess, worker_id: str) -> JobRecord:
        """The job's record, if the asker holds its current, active attempt.

        Unlike registrations, a job without a record gets nothing: without one there is no
        scope. A record without an attempt token (placed before tokens existed) gets nothing
        either: anyone knowing the job id could otherwise read its data."""
        found = await self.jobs.get(request.job_id)
        if found is None:
            raise RegistryError(f"no job {request.job_id!r} to grant store access for", "forbidden")
        record = found[0]
        if record.attempt != request.attempt or record.state not in _ACTIVE:
            raise RegistryError(
                f"stale attempt: job {request.job_id!r} is at attempt {record.attempt} "
                f"({record.state}), not {request.attempt}: no store access",
                "conflict",
            )
        if record.worker_id != worker_id:
            raise RegistryError(
                f"job {request.job_id!r} attempt {request.attempt} is not worker "
                f"{worker_id!r}'s: no store access",
                "forbidden",
            )
        if record.attempt_token_sha256 is None or not token_matches(
            record.attempt_token_sha256, request.attempt_token
        ):
            raise RegistryError(
                f"job {request.job_id!r} attempt {request.attempt} is not this worker's",
                "forbidden",
            )
        return record

    async def _dataset_keys(self, record: JobRecord) -> list[str]:
        keys = []
        for dataset_id in (record.spec.dataset, record.spec.validation):
            if dataset_id is None:
                continue
            found = await self.datasets.get(f"{record.tenant}.{dataset_id}")
            if found is not None:
                keys.append(found[0].store_key)
        return keys

"""The store signer: scoped, short-lived store access for workers that hold no store keys.

A provider's agent asks ``swarm.registry.store.access`` for each operation with its
assignment's attempt token. The registry holds the store's keys and the job records (it fences
adapter registrations the same way), so it can tell whether the asker runs the job's current
attempt and whether the key lies in that attempt's scope (``swarm_contracts.store_access``).
A Tinker training session's worker asks the same way with its session token and the token of
its lease's attempt, which the session lease (written by the scheduler) is checked against.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.jobs import JobRecord, utcnow
from swarm_contracts.layout import InvalidKey, tokens_of_dataset, validate_key
from swarm_contracts.sessions import SessionLease, is_session
from swarm_contracts.store_access import (
    StoreAccess,
    StoredObject,
    StoreGrant,
    job_scope,
    session_scope,
)
from swarm_registry.attempt_holder import check_session_access, check_store_access
from swarm_registry.errors import RegistryError
from swarm_runtime.records import RecordTable
from swarm_runtime.store import ObjectStore, S3Store

# Long enough for one object of a large base model over a slow link, short enough that a URL
# that leaks is soon worthless; a URL names one object and one method.
URL_LIFETIME = timedelta(minutes=15)
_METHODS = {"get": "GET", "put": "PUT", "delete": "DELETE"}


class StoreSigner:
    def __init__(
        self,
        store: ObjectStore,
        jobs: RecordTable[JobRecord],
        datasets: RecordTable[DatasetInfo],
        sessions: RecordTable[SessionLease],
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.datasets = datasets
        self.sessions = sessions

    async def access(self, request: StoreAccess, sender_worker_id: str | None = None) -> StoreGrant:
        """A grant for one operation of the job's current attempt; ``sender_worker_id``: the
        worker that asked, where the request's subject says so."""
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
        if is_session(request.job_id):
            held = await self.sessions.get(request.job_id)
            lease = check_session_access(request, held[0] if held else None, sender_worker_id)
            scope, what = session_scope(lease), "session"
        else:
            entry = await self.jobs.get(request.job_id)
            record = check_store_access(request, entry[0] if entry else None, sender_worker_id)
            datasets, tokens = await self._dataset_keys(record)
            scope, what = job_scope(record, datasets, tokens), "job"
        if not scope.allows(request.op, request.key):
            raise RegistryError(
                f"{request.op} {request.key!r} is outside {what} {request.job_id!r} attempt "
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

    async def _dataset_keys(self, record: JobRecord) -> tuple[list[str], list[str]]:
        """The store keys of the job's datasets, and the token cache of its training set."""
        keys, tokens = [], []
        for dataset_id in (record.spec.dataset, record.spec.validation):
            if dataset_id is None:
                continue
            found = await self.datasets.get(f"{record.tenant}.{dataset_id}")
            if found is not None:
                keys.append(found[0].store_key)
                if dataset_id == record.spec.dataset:
                    tokens.append(tokens_of_dataset(record.tenant, found[0].sha256))
        return keys, tokens

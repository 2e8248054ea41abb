"""Adapters: versions made from a training job's output, one per job, with full lineage."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from swarm_common.jobs import JobRecord
from swarm_common.records import RecordTable
from swarm_common.registry import (
    AdapterVersion,
    GetAdapter,
    ListAdapters,
    RegisterAdapter,
    parse_adapter_ref,
)
from swarm_common.store import ObjectStore
from swarm_registry.aliases import AliasBook, Promoted
from swarm_registry.errors import RegistryError
from swarm_registry.inspection import check_source, copy_tree
from swarm_registry.versions import (
    Versions,
    check_name,
    increment,
    latest_key,
    parse_version_key,
    version_key,
)

log = logging.getLogger(__name__)

# Job ids become a KV key token; all-digit ids would read as a version of an adapter "job".
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]*[A-Za-z_-][A-Za-z0-9_-]*$")

Announce = Callable[[AdapterVersion], Awaitable[None]]
# A job index entry of a deleted version: a late retry of that job must not bring it back.
DELETED = "deleted:"


def job_index_key(job_id: str) -> str:
    if not _JOB_ID.match(job_id) or job_id == "latest":
        raise RegistryError(f"invalid job id {job_id!r}")
    return f"job.{job_id}"


def adapter_store_key(tenant: str, name: str, version: int) -> str:
    return f"adapters/{tenant}/{name}/{version}"


class AdapterCatalog:
    def __init__(
        self,
        kv: KeyValue,
        store: ObjectStore,
        announce: Announce,
        jobs: RecordTable[JobRecord],
        promoted: Promoted,
    ) -> None:
        self.kv = kv
        self.versions: Versions[AdapterVersion] = Versions(kv, AdapterVersion)
        self.store = store
        self.announce = announce
        self.jobs = jobs
        self.aliases = AliasBook(kv, self.versions, promoted)

    async def _fence(self, job_id: str, attempt: int) -> None:
        """Refuse a worker whose attempt is no longer the job's current one.

        A worker that lost its lease (its job was requeued and placed elsewhere) may still
        finish and ask to register: only the current attempt may make a version. A job with
        no record is allowed (registrations made outside the scheduler, e.g. imports and
        tests); the record, when there is one, is the authority.
        """
        found = await self.jobs.get(job_id)
        if found is not None and found[0].attempt != attempt:
            raise RegistryError(
                f"stale attempt: job {job_id!r} is at attempt {found[0].attempt}, "
                f"not {attempt}; this worker's result is not registered"
            )

    async def _claim(self, job_id: str, name: str) -> tuple[str, int]:
        """The (name, version) this job's adapter is, reserving a new version the first time.

        The version is reserved before the files are copied (they go to a versioned key), and
        the job index is written with a KV create, so a retried or duplicated request finds the
        first one's version instead of making another. A request that loses that race leaves
        its reserved number unused: versions are unique and increasing, not gap-free.
        """
        index = job_index_key(job_id)
        for _ in range(2):
            try:
                entry = await self.kv.get(index)
            except KeyNotFoundError:
                entry = None
            if entry is not None and entry.value and entry.operation not in ("DEL", "PURGE"):
                value = entry.value.decode()
                if value.startswith(DELETED):
                    raise RegistryError(
                        f"job {job_id!r}: its adapter {value[len(DELETED) :]} was deleted"
                    )
                parsed = parse_version_key(value)
                if parsed is None:
                    raise RegistryError(f"corrupt job index {index!r}")
                return parsed
            version = await increment(self.kv, latest_key(name))
            try:
                await self.kv.create(index, version_key(name, version).encode())
                return name, version
            except KeyWrongLastSequenceError:
                continue
        raise RegistryError(f"job {job_id!r}: could not claim an adapter version")

    async def register(self, request: RegisterAdapter) -> AdapterVersion:
        check_name(request.name, "adapter name")
        tenant = check_name(request.lineage.tenant, "tenant")
        job_index_key(request.lineage.job_id)
        if request.lineage.parent is not None:
            check_ref(request.lineage.parent)
        await self._fence(request.lineage.job_id, request.lineage.attempt)
        # Refuse bad input before reserving a version, so a rejected request claims nothing.
        source = await asyncio.to_thread(check_source, self.store, request.store_key)
        name, version = await self._claim(request.lineage.job_id, request.name)
        existing = await self.versions.get(name, version)
        if existing is not None:
            return existing
        # Either the first request for this job, or a retry after a registration that died
        # between claiming its version and writing the record: both finish the claimed version.
        target = adapter_store_key(tenant, name, version)
        files = await asyncio.to_thread(copy_tree, self.store, source, target)
        record = AdapterVersion(
            name=name,
            version=version,
            tenant=tenant,
            store_key=target,
            files=files,
            lineage=request.lineage,
        )
        if not await self.versions.create(name, version, record):
            # A concurrent retry of the same job finished first; its record is the answer.
            winner = await self.versions.get(name, version)
            if winner is None:
                raise RegistryError(f"adapter {name!r} version {version} vanished")
            return winner
        await self.announce(record)
        log.info("registered adapter %s v%d for job %s", name, version, request.lineage.job_id)
        try:
            await self.aliases.apply_rules(record)
        except Exception:
            # The version is registered either way; a rule can be re-applied by hand.
            log.exception("promotion rules for %s v%d failed", name, version)
        return record

    async def get(self, request: GetAdapter) -> AdapterVersion:
        name, version, alias = parse_adapter_ref(request.name)
        version = request.version if request.version is not None else version
        alias = request.alias or alias
        if alias is not None:
            return await self._by_alias(name, alias, request.tenant)
        if version is not None:
            record = await self.versions.get(name, version)
            if record is not None and request.tenant in (None, record.tenant):
                return record
            raise RegistryError(f"unknown adapter {name!r} version {version}")
        # Latest visible to the caller: another tenant's newer version does not hide ours.
        for candidate in await self.versions.newest(name):
            record = await self.versions.get(name, candidate)
            if record is not None and request.tenant in (None, record.tenant):
                return record
        raise RegistryError(f"unknown adapter {name!r}")

    async def _by_alias(self, name: str, alias: str, tenant: str | None) -> AdapterVersion:
        holders = {
            (t, a): v
            for (t, a), v in (await self.aliases.holders(name)).items()
            if a == alias and tenant in (None, t)
        }
        if len(holders) > 1:
            raise RegistryError(f"alias {alias!r} of {name!r} is ambiguous: give a tenant")
        for version in holders.values():
            record = await self.versions.get(name, version)
            if record is not None:
                return record
        raise RegistryError(f"unknown adapter {name!r} alias {alias!r}")

    async def list(self, request: ListAdapters) -> list[AdapterVersion]:
        model, model_version, _ = parse_adapter_ref(request.base_model or "")
        return [
            record
            for _, _, record in await self.versions.all(request.name)
            if request.tenant in (None, record.tenant)
            and (not request.base_model or record.lineage.base_model == model)
            and model_version in (None, record.lineage.base_model_version)
        ]


def check_ref(ref: str) -> None:
    """A parent must be written ``name@version``: the lineage is pinned, never an alias."""
    name, version, _ = parse_adapter_ref(ref)
    check_name(name, "adapter name")
    if version is None:
        raise RegistryError(f"invalid parent {ref!r}: must be name@version")

"""Adapters: versions made from a training job's output, one per job, with full lineage."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from swarm_contracts.jobs import JobRecord
from swarm_contracts.layout import adapter_prefix
from swarm_contracts.providers import token_matches
from swarm_contracts.refs import Ref
from swarm_contracts.registry import (
    AdapterVersion,
    GetAdapter,
    ListAdapters,
    RegisterAdapter,
)
from swarm_registry.aliases import AliasBook, Promoted
from swarm_registry.errors import RegistryError
from swarm_registry.inspection import check_source, copy_tree
from swarm_registry.versions import (
    Versions,
    check_name,
    increment,
    latest_key,
    parse_version_key,
    scoped,
    unscoped,
    version_key,
)
from swarm_runtime.records import RecordTable
from swarm_runtime.store import ObjectStore

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

    async def _fence(
        self, job_id: str, attempt: int, token: str | None, worker_id: str | None
    ) -> None:
        """Refuse a worker whose attempt is no longer the job's current one, or not its own.

        A worker that lost its lease (its job was requeued and placed elsewhere) may still
        finish and ask to register: only the current attempt may make a version. A job with
        no record is allowed only for a trusted service (``worker_id`` None: imports and
        tests); the record, when there is one, is the authority. A worker (``worker_id``, the
        sender as its subject names it) registers only for the attempt the record gives it.
        """
        found = await self.jobs.get(job_id)
        if worker_id is not None and found is None:
            raise RegistryError(
                f"no job {job_id!r}: worker {worker_id!r} has nothing to register", "forbidden"
            )
        if found is not None and found[0].attempt != attempt:
            raise RegistryError(
                f"stale attempt: job {job_id!r} is at attempt {found[0].attempt}, "
                f"not {attempt}; this worker's result is not registered",
                "conflict",
            )
        if worker_id is not None and found is not None and found[0].worker_id != worker_id:
            raise RegistryError(
                f"job {job_id!r} attempt {attempt} is not worker {worker_id!r}'s: "
                "no adapter registered",
                "forbidden",
            )
        if found is not None and not token_matches(found[0].attempt_token_sha256, token):
            raise RegistryError(
                f"job {job_id!r} attempt {attempt} is not this worker's: no adapter registered",
                "forbidden",
            )

    async def _claim(self, job_id: str, name: str) -> tuple[str, int]:
        """The (scoped name, version) this job's adapter is, reserving a new version the first time.

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
                        f"job {job_id!r}: its adapter {value[len(DELETED) :]} was deleted",
                        "conflict",
                    )
                parsed = parse_version_key(value)
                if parsed is None:
                    raise RegistryError(f"corrupt job index {index!r}", "internal")
                return parsed
            version = await increment(self.kv, latest_key(name))
            try:
                await self.kv.create(index, version_key(name, version).encode())
                return name, version
            except KeyWrongLastSequenceError:
                continue
        raise RegistryError(f"job {job_id!r}: could not claim an adapter version", "conflict")

    async def register(
        self, request: RegisterAdapter, worker_id: str | None = None
    ) -> AdapterVersion:
        """Register a job's adapter. ``worker_id``: the worker that asked, from the subject of
        its request (None: a trusted service, e.g. an import)."""
        check_name(request.name, "adapter name")
        tenant = check_name(request.lineage.tenant, "tenant")
        job_index_key(request.lineage.job_id)
        if request.lineage.parent is not None:
            check_ref(request.lineage.parent)
        await self._fence(
            request.lineage.job_id, request.lineage.attempt, request.attempt_token, worker_id
        )
        # Refuse bad input before reserving a version, so a rejected request claims nothing.
        source = await asyncio.to_thread(check_source, self.store, request.store_key)
        key_name, version = await self._claim(request.lineage.job_id, scoped(tenant, request.name))
        _, name = unscoped(key_name)
        existing = await self.versions.get(key_name, version)
        if existing is not None:
            return existing
        # Either the first request for this job, or a retry after a registration that died
        # between claiming its version and writing the record: both finish the claimed version.
        target = adapter_prefix(tenant, name, version)
        files = await asyncio.to_thread(copy_tree, self.store, source, target)
        record = AdapterVersion(
            name=name,
            version=version,
            tenant=tenant,
            store_key=target,
            files=files,
            lineage=request.lineage,
        )
        if not await self.versions.create(key_name, version, record):
            # A concurrent retry of the same job finished first; its record is the answer.
            winner = await self.versions.get(key_name, version)
            if winner is None:
                raise RegistryError(f"adapter {name!r} version {version} vanished", "conflict")
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
        name, version, alias = parse_ref(request.name)
        version = request.version if request.version is not None else version
        alias = request.alias or alias
        if alias is not None:
            return await self._by_alias(name, alias, request.tenant)
        tenant = request.tenant or await self._only_tenant(name, version)
        if version is not None:
            record = await self.versions.get(scoped(tenant, name), version)
            if record is not None:
                return record
            raise RegistryError(f"unknown adapter {name!r} version {version}", "not_found")
        record = await self.versions.latest(scoped(tenant, name))
        if record is not None:
            return record
        raise RegistryError(f"unknown adapter {name!r}", "not_found")

    async def _only_tenant(self, name: str, version: int | None) -> str:
        """The tenant of a lookup that names none (internal callers, who see every tenant):
        the one tenant with such an adapter (and version); ambiguous when several have it."""
        tenants = {
            record.tenant
            for _, _, record in await self.versions.all()
            if record.name == name and version in (None, record.version)
        }
        if len(tenants) > 1:
            raise RegistryError(f"adapter {name!r} is ambiguous: give a tenant")
        if not tenants:
            suffix = f" version {version}" if version is not None else ""
            raise RegistryError(f"unknown adapter {name!r}{suffix}", "not_found")
        return tenants.pop()

    async def _by_alias(self, name: str, alias: str, tenant: str | None) -> AdapterVersion:
        holders = {
            (t, a): v
            for (t, a), v in (await self.aliases.holders(name)).items()
            if a == alias and tenant in (None, t)
        }
        if len(holders) > 1:
            raise RegistryError(f"alias {alias!r} of {name!r} is ambiguous: give a tenant")
        for (holder_tenant, _), version in holders.items():
            record = await self.versions.get(scoped(holder_tenant, name), version)
            if record is not None:
                return record
        raise RegistryError(f"unknown adapter {name!r} alias {alias!r}", "not_found")

    async def list(self, request: ListAdapters) -> list[AdapterVersion]:
        model, model_version, _ = parse_ref(request.base_model) if request.base_model else Ref("")
        return [
            record
            for _, _, record in await self.versions.all()
            if request.tenant in (None, record.tenant)
            and request.name in (None, record.name)
            and (not request.base_model or record.lineage.base_model == model)
            and model_version in (None, record.lineage.base_model_version)
        ]


def parse_ref(ref: str) -> Ref:
    try:
        return Ref.parse(ref)
    except ValueError as exc:
        raise RegistryError(str(exc)) from exc


def check_ref(ref: str) -> None:
    """A parent must be written ``name@version``: the lineage is pinned, never an alias."""
    name, version, _ = parse_ref(ref)
    check_name(name, "adapter name")
    if version is None:
        raise RegistryError(f"invalid parent {ref!r}: must be name@version")

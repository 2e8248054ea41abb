"""Deleting adapter versions and garbage-collecting store objects nothing refers to.

What ``gc.run`` removes:

* ``adapters/<tenant>/<name>/<version>/…`` with no version record and no registration in
  flight (a job index entry claiming that version);
* ``outputs/<job_id>/…`` and ``checkpoints/<job_id>/…`` (every attempt's Ray run and resume
  copy) of finished jobs (succeeded, failed or cancelled): every checkpoint, not just all but
  one. A finished job never resumes, the registered adapter is a full copy under
  ``adapters/``, and continuing training starts from that adapter (``from_adapter``), not from
  a checkpoint. Jobs with no record are left alone:
  the record may not be written yet; so are the checkpoints of a finished job whose
  verification is pending (a replay starts from them and compares with them);
* ``models/…`` objects under no model version's ``store_key``;
* ``tokens/<tenant>/<sha256>/…`` (the trainer's token cache of a dataset) once the tenant's
  dataset record is gone (deleted through the gateway) and no unfinished job names it: the
  cache goes with its dataset. A verification replay that comes later tokenizes again, to
  the same tokens.

Unreferenced adapter and model objects younger than ``min_age_s`` are spared: the gateway
uploads a model before asking to register it. The store is listed *before* the records are
read, so an object written after the listing is never a candidate, and one written before it
belongs to a registration whose claim the records then show.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.errors import KeyNotFoundError

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.jobs import JobRecord
from swarm_contracts.layout import (
    ADAPTERS,
    CHECKPOINTS,
    MODELS,
    OUTPUTS,
    TOKENS,
    dataset_of_tokens,
    job_checkpoints,
    job_of,
    parse_adapter_key,
)
from swarm_contracts.registry import (
    AdapterKey,
    AdapterVersion,
    GcReport,
    GetAdapter,
    ModelVersion,
    RunGc,
)
from swarm_registry.adapters import DELETED, AdapterCatalog, job_index_key
from swarm_registry.errors import RegistryError
from swarm_registry.inspection import object_age_s
from swarm_registry.versions import Versions, parse_version_key, scoped
from swarm_runtime.records import RecordTable
from swarm_runtime.store import ObjectStore

log = logging.getLogger(__name__)


async def delete_version(catalog: AdapterCatalog, request: AdapterKey) -> AdapterVersion:
    """Remove a version's record and files; refused while an alias points at it."""
    record = await catalog.get(
        GetAdapter(
            name=request.name,
            version=request.version,
            tenant=request.tenant,
            include_quarantined=True,
        )
    )
    holding = sorted(
        alias
        for (tenant, alias), version in (await catalog.aliases.holders(record.name)).items()
        if tenant == record.tenant and version == record.version
    )
    if holding:
        raise RegistryError(
            f"adapter {record.name!r} version {record.version} is held by alias "
            f"{', '.join(repr(a) for a in holding)}: move the alias first",
            "conflict",
        )
    # Record first: from here on nobody is handed the files that are about to go.
    await catalog.versions.delete(scoped(record.tenant, record.name), record.version)
    await catalog.kv.put(
        job_index_key(record.lineage.job_id),
        f"{DELETED}{record.name}.{record.version}".encode(),
    )
    await asyncio.to_thread(catalog.store.delete_prefix, record.store_key + "/")
    log.info("deleted adapter %s v%d", record.name, record.version)
    return record


class Collector:
    def __init__(
        self,
        store: ObjectStore,
        adapters: AdapterCatalog,
        models: Versions[ModelVersion],
        jobs: RecordTable[JobRecord],
        datasets: RecordTable[DatasetInfo],
    ) -> None:
        self.store = store
        self.adapters = adapters
        self.models = models
        self.jobs = jobs
        self.datasets = datasets

    async def run(self, request: RunGc) -> GcReport:
        listed = await asyncio.to_thread(self._list)
        # Records are read only now, after the listing: see the module docstring.
        versions = await self.adapters.versions.all()
        kept_adapters = {record.store_key for _, _, record in versions}
        claimed = await self._claimed()
        model_prefixes = [m.store_key.rstrip("/") + "/" for _, _, m in await self.models.all()]
        records = await self.jobs.all()
        finished = {job.job_id for job in records if job.state.terminal}
        replaying = {
            job.job_id
            for job in records
            if job.verification is not None and job.verification.outcome == "pending"
        }

        def old(key: str) -> bool:
            return object_age_s(self.store, key) >= request.min_age_s

        report = GcReport()
        for key in listed[ADAPTERS]:
            location = parse_adapter_key(key)
            if location is None or location.prefix in kept_adapters:
                continue
            # adapters/<tenant>/<name>/<version>: claims are by (<tenant>.<name>, version).
            tenant = location.prefix.split("/")[1]
            claim = (scoped(tenant, location.name), location.version)
            if claim in claimed or not await asyncio.to_thread(old, key):
                continue
            report.adapters.append(key)
        for key in listed[OUTPUTS]:
            if job_of(key) in finished:
                report.outputs.append(key)
        for key in listed[CHECKPOINTS]:
            if job_of(key) in finished - replaying:
                report.checkpoints.append(key)
        for key in listed[MODELS]:
            if not any(key.startswith(p) for p in model_prefixes) and await asyncio.to_thread(
                old, key
            ):
                report.models.append(key)
        report.tokens = await self._orphan_tokens(listed[TOKENS], records)
        if not request.dry_run:
            await asyncio.to_thread(self._delete, report)
        return report

    async def _orphan_tokens(self, keys: list[str], records: list[JobRecord]) -> list[str]:
        """The token cache objects of datasets that are gone and that no unfinished job
        names."""
        in_use = {
            (job.tenant, dataset)
            for job in records
            if not job.state.terminal
            for dataset in (job.spec.dataset, job.spec.validation)
            if dataset is not None
        }
        kept: dict[tuple[str, str], bool] = {}
        orphans = []
        for key in keys:
            found = dataset_of_tokens(key)
            if found is None:
                continue
            if found not in kept:
                tenant, dataset_id = found[0], dataset_id_for(found[1])
                record = await self.datasets.get(f"{tenant}.{dataset_id}")
                kept[found] = (tenant, dataset_id) in in_use or record is not None
            if not kept[found]:
                orphans.append(key)
        return orphans

    def _list(self) -> dict[str, list[str]]:
        kinds = (ADAPTERS, OUTPUTS, CHECKPOINTS, MODELS, TOKENS)
        return {kind: self.store.list(f"{kind}/") for kind in kinds}

    async def _claimed(self) -> set[tuple[str, int | None]]:
        """(name, version) of every live job index entry: registrations possibly copying."""
        claimed: set[tuple[str, int | None]] = set()
        for key in await self.adapters.versions.table.keys():
            if not key.startswith("job."):
                continue
            try:
                entry = await self.adapters.kv.get(key)
            except KeyNotFoundError:
                continue
            value = entry.value.decode() if entry.value else ""
            parsed = None if value.startswith(DELETED) else parse_version_key(value)
            if parsed is not None:
                claimed.add(parsed)
        return claimed

    def _delete(self, report: GcReport) -> None:
        kinds = (report.adapters, report.outputs, report.checkpoints, report.models, report.tokens)
        for keys in kinds:
            for key in keys:
                self.store.delete(key)
        if report.checkpoints:
            # Ray's S3 storage leaves empty "dir/" marker objects that list() does not show.
            for job in sorted({job for k in report.checkpoints if (job := job_of(k))}):
                self.store.delete_prefix(job_checkpoints(job) + "/")
        log.info(
            "gc removed %d adapter, %d output, %d checkpoint, %d model and %d token objects",
            len(report.adapters),
            len(report.outputs),
            len(report.checkpoints),
            len(report.models),
            len(report.tokens),
        )

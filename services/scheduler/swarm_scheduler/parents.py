"""``from_adapter`` and ``from_checkpoint``: pinning what a job starts from, through the
registry.

The adapter must be the submitting tenant's own (the registry answers a tenant-scoped query,
so another tenant's version reads as unknown) and trained on exactly the job's base model.
An alias (``bot@production``) is resolved here, once: the job and its lineage name the version.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from swarm_contracts.jobs import ForkPoint, JobRecord, JobSpec, ModelRef, ParentAdapter
from swarm_contracts.refs import Ref
from swarm_contracts.registry import ForkCheckpoint, GetAdapter, continued_spec, forked_spec
from swarm_contracts.registry_api import FORK_CHECKPOINT, GET_ADAPTER
from swarm_contracts.subjects import Subjects
from swarm_runtime.rpc import Refused, Unavailable
from swarm_scheduler.registry_client import registry_of


class UnusableParent(LookupError):
    """The job cannot continue from ``from_adapter``; the message is the job's failure reason."""


async def resolve_parent(
    broker: NatsBroker, subjects: Subjects, spec: JobSpec, tenant: str, base_model: ModelRef
) -> tuple[ParentAdapter, JobSpec]:
    """The pinned parent, and the spec the job runs with: its LoRA shape is the parent's."""
    assert spec.from_adapter is not None
    ref = spec.from_adapter
    request = GetAdapter(name=ref, tenant=tenant)
    try:
        found = await registry_of(broker, subjects).call(GET_ADAPTER, request)
    except Refused as exc:
        if exc.code == "internal":
            raise Unavailable("registry", exc.message) from exc
        raise UnusableParent(f"from_adapter {ref!r}: {exc.message} for tenant {tenant!r}") from exc
    mismatch = found.lineage.base_model_mismatch(base_model.name, base_model.version)
    if mismatch is not None:
        raise UnusableParent(
            f"from_adapter {ref!r} was {mismatch}, not on the job's base model "
            f"{base_model.name}@{base_model.version}"
        )
    parent = ParentAdapter(
        name=found.name, version=found.version, store_key=found.store_key, files=found.files
    )
    return parent, continued_spec(spec, found)


class UnusableCheckpoint(LookupError):
    """The job cannot start from ``from_checkpoint``; the message is the job's failure reason."""


async def resolve_fork(
    broker: NatsBroker, subjects: Subjects, record: JobRecord
) -> tuple[ForkPoint, JobSpec, ModelRef]:
    """``from_checkpoint``: the checkpoint pinned (the registry copies it among the job's own
    checkpoints), the spec the job runs with (the source's LoRA shape), and the base model it
    runs on: the source's version. A spec naming the base model without a version gets the
    source's; one naming another model or version is refused, as for ``from_adapter``."""
    spec = record.spec
    assert spec.from_checkpoint is not None
    ref = spec.from_checkpoint
    request = ForkCheckpoint(
        job_id=record.job_id,
        tenant=record.tenant,
        source=ref,
        optimizer=spec.from_checkpoint_optimizer,
    )
    try:
        found = await registry_of(broker, subjects).call(FORK_CHECKPOINT, request)
    except Refused as exc:
        if exc.code == "internal":
            raise Unavailable("registry", exc.message) from exc
        raise UnusableCheckpoint(f"from_checkpoint {ref!r}: {exc.message}") from exc
    source = found.base_model
    wanted = Ref.parse_versioned(spec.base_model)
    if source.name != wanted.name or wanted.version not in (None, source.version):
        raise UnusableCheckpoint(
            f"from_checkpoint {ref!r} was trained on {source.name}@{source.version}, not on "
            f"the job's base model {spec.base_model}"
        )
    return found.fork, forked_spec(spec, found.lora), source

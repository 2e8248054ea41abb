"""``from_adapter``: pinning the adapter a job continues training from, through the registry.

The adapter must be the submitting tenant's own (the registry answers a tenant-scoped query,
so another tenant's version reads as unknown) and trained on exactly the job's base model.
An alias (``bot@production``) is resolved here, once: the job and its lineage name the version.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from swarm_common.jobs import JobSpec, ModelRef, ParentAdapter
from swarm_common.registry import AdapterVersion, GetAdapter
from swarm_common.subjects import Subjects
from swarm_scheduler.registry_client import ask_registry


class UnusableParent(LookupError):
    """The job cannot continue from ``from_adapter``; the message is the job's failure reason."""


async def resolve_parent(
    broker: NatsBroker, subjects: Subjects, spec: JobSpec, tenant: str, base_model: ModelRef
) -> tuple[ParentAdapter, JobSpec]:
    """The pinned parent, and the spec the job runs with: its LoRA shape is the parent's."""
    assert spec.from_adapter is not None
    ref = spec.from_adapter
    request = GetAdapter(name=ref, tenant=tenant)
    reply = await ask_registry(broker, subjects, "adapters.get", request, AdapterVersion)
    if not reply.ok or reply.result is None:
        raise UnusableParent(
            f"from_adapter {ref!r}: {reply.error or 'unknown adapter'} for tenant {tenant!r}"
        )
    found = reply.result
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


def continued_spec(spec: JobSpec, parent: AdapterVersion) -> JobSpec:
    """A LoRA's shape (rank, scale, target modules) cannot change while training continues, so
    the parent's replaces the spec's; dropout only acts during training and stays the job's.
    The replacement is written into the job record, so what the job runs with is visible."""
    lora = parent.lineage.lora.model_copy(update={"dropout": spec.lora.dropout})
    return spec.model_copy(update={"lora": lora})

"""Resolving a job's base model through the registry's request/reply API."""

from __future__ import annotations

from faststream.nats import NatsBroker

from swarm_contracts.jobs import ModelRef
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetModel, ModelVersion
from swarm_contracts.registry_api import GET_MODEL
from swarm_contracts.subjects import Subjects
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable


class UnknownModel(LookupError):
    pass


def registry_of(broker: NatsBroker, subjects: Subjects) -> ServiceClient:
    return ServiceClient(broker.connection, "registry", subjects.registry)


def parse_model_ref(ref: str) -> GetModel:
    parsed = Ref.parse_versioned(ref)
    return GetModel(name=parsed.name, version=parsed.version)


async def resolve_model(broker: NatsBroker, subjects: Subjects, ref: str) -> ModelVersion:
    """Pin ``name[@version]`` to one registered version, so a job never drifts to a newer one.

    ``UnknownModel`` when the registry refuses (the job fails with its reason), except for its
    own ``internal`` failures, which read as unavailable: the submission is tried again."""
    try:
        m = await registry_of(broker, subjects).call(GET_MODEL, parse_model_ref(ref))
    except Refused as exc:
        if exc.code == "internal":
            raise Unavailable("registry", exc.message) from exc
        raise UnknownModel(exc.message) from exc
    return m


def model_ref(m: ModelVersion) -> ModelRef:
    return ModelRef(
        name=m.name, version=m.version, store_key=m.store_key, digest=m.digest, hf_id=m.hf_id
    )

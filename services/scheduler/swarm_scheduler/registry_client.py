"""Resolving a job's base model through the registry's request/reply API."""

from __future__ import annotations

from typing import TypeVar

from faststream.nats import NatsBroker
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel

from swarm_common.jobs import ModelRef
from swarm_common.registry import GetModel, ModelVersion, Reply
from swarm_common.subjects import Subjects

T = TypeVar("T", bound=BaseModel)


class UnknownModel(LookupError):
    pass


class RegistryUnavailable(ConnectionError):
    pass


def parse_model_ref(ref: str) -> GetModel:
    name, _, version = ref.partition("@")
    return GetModel(name=name, version=int(version) if version else None)


async def ask_registry(
    broker: NatsBroker, subjects: Subjects, action: str, request: BaseModel, result: type[T]
) -> Reply[T]:
    """One registry request/reply; RegistryUnavailable when nobody answers in time."""
    try:
        response = await broker.request(request, subjects.registry(action), timeout=5.0)
    except (NoRespondersError, NatsTimeout, TimeoutError) as exc:
        raise RegistryUnavailable("the registry did not answer") from exc
    return Reply[result].model_validate_json(response.body)  # type: ignore[valid-type]


async def resolve_model(broker: NatsBroker, subjects: Subjects, ref: str) -> ModelRef:
    """Pin ``name[@version]`` to one registered version, so a job never drifts to a newer one."""
    reply = await ask_registry(broker, subjects, "models.get", parse_model_ref(ref), ModelVersion)
    if not reply.ok or reply.result is None:
        raise UnknownModel(reply.error or f"unknown base model {ref!r}")
    m = reply.result
    return ModelRef(name=m.name, version=m.version, store_key=m.store_key, digest=m.digest)

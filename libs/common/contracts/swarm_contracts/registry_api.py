"""The registry's request/reply API: every action, named once with its request and result,
for the registry's handlers and for all its callers.

Services ask on ``swarm.registry.<action>`` (``Subjects.registry``); a worker asks on its own
``swarm.workers.<id>.registry.<action>`` (``Subjects.worker_registry``), where NATS lets only
that worker send, so the registry knows who asks. Every reply is a ``Reply[result]``.
"""

from __future__ import annotations

from typing import Any

from swarm_contracts.registry import (
    AdapterKey,
    AdapterVersion,
    AliasTarget,
    ForkCheckpoint,
    ForkSource,
    GcReport,
    GetAdapter,
    GetModel,
    LineageGraph,
    ListAdapters,
    ListModels,
    ModelVersion,
    PromotionRule,
    QuarantineJob,
    RegisterAdapter,
    RegisterModel,
    RunGc,
    SetAlias,
    VerifyReport,
)
from swarm_contracts.replies import Action
from swarm_contracts.store_access import StoreAccess, StoreGrant

REGISTER_MODEL = Action("models.register", RegisterModel, ModelVersion)
GET_MODEL = Action("models.get", GetModel, ModelVersion)
LIST_MODELS = Action("models.list", ListModels, list[ModelVersion])

REGISTER_ADAPTER = Action("adapters.register", RegisterAdapter, AdapterVersion)
GET_ADAPTER = Action("adapters.get", GetAdapter, AdapterVersion)
LIST_ADAPTERS = Action("adapters.list", ListAdapters, list[AdapterVersion])
DELETE_ADAPTER = Action("adapters.delete", AdapterKey, AdapterVersion)
VERIFY_ADAPTER = Action("adapters.verify", AdapterKey, VerifyReport)
ADAPTER_LINEAGE = Action("adapters.lineage", AdapterKey, LineageGraph)
SET_ALIAS = Action("adapters.alias.set", SetAlias, AliasTarget)
SET_RULE = Action("adapters.rule.set", PromotionRule, PromotionRule)
# The scheduler's, when a job's verification failed: the version the job made, or not_found.
QUARANTINE_ADAPTER = Action("adapters.quarantine", QuarantineJob, AdapterVersion)
UNQUARANTINE_ADAPTER = Action("adapters.unquarantine", AdapterKey, AdapterVersion)

RUN_GC = Action("gc.run", RunGc, GcReport)

# A job's ``from_checkpoint``: the scheduler pins it (a copy among the fork's own
# checkpoints); the gateway asks for a dry run to refuse a bad one up front.
FORK_CHECKPOINT = Action("checkpoints.fork", ForkCheckpoint, ForkSource)

# A worker without store keys asks for each store operation of its job (a presigned URL).
STORE_ACCESS = Action("store.access", StoreAccess, StoreGrant)

SERVICE_ACTIONS: tuple[Action[Any, Any], ...] = (
    REGISTER_MODEL,
    GET_MODEL,
    LIST_MODELS,
    REGISTER_ADAPTER,
    GET_ADAPTER,
    LIST_ADAPTERS,
    DELETE_ADAPTER,
    VERIFY_ADAPTER,
    ADAPTER_LINEAGE,
    SET_ALIAS,
    SET_RULE,
    QUARANTINE_ADAPTER,
    UNQUARANTINE_ADAPTER,
    RUN_GC,
    FORK_CHECKPOINT,
)
"""What trusted services ask on ``swarm.registry.<action>``."""

WORKER_ACTIONS: tuple[Action[Any, Any], ...] = (REGISTER_ADAPTER, STORE_ACCESS)
"""What a worker asks on its own ``swarm.workers.<id>.registry.<action>``: it registers what
its attempt made, and asks for store access for its job; the registry acts only for the worker
that holds the job's current attempt."""

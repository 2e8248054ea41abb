"""The registry's FastStream app: NATS request/reply handlers over the models/adapters buckets."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from opentelemetry.trace import Status, StatusCode, Tracer

from swarm_contracts import registry_api as api
from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobRecord
from swarm_contracts.registry import (
    AdapterKey,
    AdapterPromoted,
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
    Reply,
    RunGc,
    SetAlias,
    VerifyReport,
)
from swarm_contracts.sessions import SessionLease
from swarm_contracts.store_access import StoreAccess, StoreGrant
from swarm_contracts.subjects import Subjects
from swarm_registry.adapters import AdapterCatalog
from swarm_registry.forks import Forks
from swarm_registry.integrity import verify
from swarm_registry.lineage import lineage_graph
from swarm_registry.metrics import RegistryMetrics
from swarm_registry.models import ModelCatalog
from swarm_registry.retention import Collector, delete_version
from swarm_registry.store_access import StoreSigner
from swarm_runtime.broker import make_broker
from swarm_runtime.prometheus import MetricsServer
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Route, answer, route
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_runtime.tracing import setup_tracing, tracer_of

log = logging.getLogger(__name__)

SERVICE = "registry"
# Registrations hash and copy files: let a few run at once so one big model does not stall
# every query behind it. Version allocation is compare-and-set, so concurrency is safe.
REGISTER_WORKERS = 4


class Catalogs:
    """Filled in at startup, once the broker is connected and the buckets exist."""

    models: ModelCatalog
    adapters: AdapterCatalog
    collector: Collector
    signer: StoreSigner
    forks: Forks


class Handlers:
    """The registry's request/reply operations, one per action of
    ``swarm_contracts.registry_api``: a typed request in, a ``Reply`` (result or error code)
    out."""

    def __init__(self, catalogs: Catalogs, tracer: Tracer) -> None:
        self.catalogs = catalogs
        self.tracer = tracer

    def routes(self) -> list[Route]:
        """A handler for every action of ``registry_api.SERVICE_ACTIONS``."""
        return [
            route(api.REGISTER_MODEL, self.register_model, REGISTER_WORKERS),
            route(api.GET_MODEL, self.get_model),
            route(api.LIST_MODELS, self.list_models),
            route(api.REGISTER_ADAPTER, self.register_adapter, REGISTER_WORKERS),
            route(api.GET_ADAPTER, self.get_adapter),
            route(api.LIST_ADAPTERS, self.list_adapters),
            route(api.DELETE_ADAPTER, self.delete_adapter),
            route(api.VERIFY_ADAPTER, self.verify_adapter, REGISTER_WORKERS),
            route(api.ADAPTER_LINEAGE, self.adapter_lineage),
            route(api.SET_ALIAS, self.set_alias),
            route(api.SET_RULE, self.set_rule),
            route(api.QUARANTINE_ADAPTER, self.quarantine_adapter),
            route(api.UNQUARANTINE_ADAPTER, self.unquarantine_adapter),
            route(api.RUN_GC, self.run_gc),
            # Copies a checkpoint: a few at once, like registrations.
            route(api.FORK_CHECKPOINT, self.fork_checkpoint, REGISTER_WORKERS),
        ]

    def worker_routes(self) -> list[Route]:
        """A handler for every action of ``registry_api.WORKER_ACTIONS``, asked on the worker's
        own subject: NATS lets only that worker send there, so the handler gets the sender's
        worker id from the subject, and acts only for the worker that holds the job's current
        attempt."""
        return [
            route(api.REGISTER_ADAPTER, self.register_worker_adapter, REGISTER_WORKERS),
            # Every store operation of a worker without keys: several at once (a checkpoint
            # upload asks for each file), each a record read and a local signature.
            route(api.STORE_ACCESS, self.store_access, REGISTER_WORKERS),
        ]

    async def register_model(self, request: RegisterModel) -> Reply[ModelVersion]:
        return await answer(Reply[ModelVersion], self.catalogs.models.register(request))

    async def get_model(self, request: GetModel) -> Reply[ModelVersion]:
        return await answer(Reply[ModelVersion], self.catalogs.models.get(request))

    async def list_models(self, request: ListModels) -> Reply[list[ModelVersion]]:
        return await answer(Reply[list[ModelVersion]], self.catalogs.models.list())

    async def register_adapter(self, request: RegisterAdapter) -> Reply[AdapterVersion]:
        """A trusted service's registration (imports): no worker to check."""
        return await self._register_adapter(request, None)

    async def register_worker_adapter(
        self, request: RegisterAdapter, message: NatsMessage
    ) -> Reply[AdapterVersion]:
        worker_id = _sender(message)
        reply = await self._register_adapter(request, worker_id)
        _log_refusal(reply, "registration", request.lineage.job_id, worker_id)
        return reply

    async def _register_adapter(
        self, request: RegisterAdapter, worker_id: str | None
    ) -> Reply[AdapterVersion]:
        lineage = request.lineage
        with self.tracer.start_as_current_span(
            "registry.register_adapter",
            attributes={
                "swarm.job_id": lineage.job_id,
                "swarm.attempt": lineage.attempt,
                "swarm.adapter": request.name,
            },
        ) as span:
            work = self.catalogs.adapters.register(request, worker_id)
            reply = await answer(Reply[AdapterVersion], work)
            if reply.result is not None:
                span.set_attribute("swarm.adapter_version", reply.result.version)
            else:
                span.set_status(Status(StatusCode.ERROR, (reply.error or "")[:200]))
            return reply

    async def get_adapter(self, request: GetAdapter) -> Reply[AdapterVersion]:
        return await answer(Reply[AdapterVersion], self.catalogs.adapters.get(request))

    async def list_adapters(self, request: ListAdapters) -> Reply[list[AdapterVersion]]:
        return await answer(Reply[list[AdapterVersion]], self.catalogs.adapters.list(request))

    async def delete_adapter(self, request: AdapterKey) -> Reply[AdapterVersion]:
        work = delete_version(self.catalogs.adapters, request)
        return await answer(Reply[AdapterVersion], work)

    async def verify_adapter(self, request: AdapterKey) -> Reply[VerifyReport]:
        return await answer(Reply[VerifyReport], self._verify(request))

    async def _verify(self, request: AdapterKey) -> VerifyReport:
        record = await self.catalogs.adapters.get(
            GetAdapter(
                name=request.name,
                version=request.version,
                tenant=request.tenant,
                include_quarantined=True,
            )
        )
        return await asyncio.to_thread(verify, self.catalogs.adapters.store, record)

    async def adapter_lineage(self, request: AdapterKey) -> Reply[LineageGraph]:
        adapters = self.catalogs.adapters
        work = lineage_graph(adapters, request.name, request.version, request.tenant)
        return await answer(Reply[LineageGraph], work)

    async def set_alias(self, request: SetAlias) -> Reply[AliasTarget]:
        return await answer(Reply[AliasTarget], self._set_alias(request))

    async def _set_alias(self, request: SetAlias) -> AliasTarget:
        record = await self.catalogs.adapters.get(
            GetAdapter(name=request.name, version=request.version, tenant=request.tenant)
        )
        return await self.catalogs.adapters.aliases.set(record, request.alias)

    async def quarantine_adapter(self, request: QuarantineJob) -> Reply[AdapterVersion]:
        return await answer(Reply[AdapterVersion], self.catalogs.adapters.quarantine(request))

    async def unquarantine_adapter(self, request: AdapterKey) -> Reply[AdapterVersion]:
        return await answer(Reply[AdapterVersion], self.catalogs.adapters.unquarantine(request))

    async def set_rule(self, request: PromotionRule) -> Reply[PromotionRule]:
        return await answer(Reply[PromotionRule], self.catalogs.adapters.aliases.set_rule(request))

    async def run_gc(self, request: RunGc) -> Reply[GcReport]:
        return await answer(Reply[GcReport], self.catalogs.collector.run(request))

    async def fork_checkpoint(self, request: ForkCheckpoint) -> Reply[ForkSource]:
        return await answer(Reply[ForkSource], self.catalogs.forks.fork(request))

    async def store_access(self, request: StoreAccess, message: NatsMessage) -> Reply[StoreGrant]:
        worker_id = _sender(message)
        reply = await answer(Reply[StoreGrant], self.catalogs.signer.access(request, worker_id))
        _log_refusal(reply, f"store access ({request.op} {request.key})", request.job_id, worker_id)
        return reply


def _log_refusal(reply: Reply[Any], what: str, job_id: str, worker_id: str) -> None:
    # A worker asking for what is not its own is worth an operator's eye (docs/security.md).
    if reply.error_code == "forbidden":
        log.warning("refused %s for job %s to worker %s: %s", what, job_id, worker_id, reply.error)


def _sender(message: NatsMessage) -> str:
    """The worker id in the subject of a worker's request (its NATS user's own subjects)."""
    return Subjects.worker_of(message.raw_message.subject) or ""


def build_app(settings: Settings) -> FastStream:
    broker: NatsBroker = make_broker(settings, SERVICE)
    subjects = Subjects(settings.namespace)
    catalogs = Catalogs()
    # Observability. Every request is a span, the child of the requester's when it sent a
    # traceparent header (the trainer does, so a registration joins the job's trace).
    tracing = setup_tracing(settings, SERVICE)
    tracer = tracer_of(tracing, SERVICE)
    metrics = RegistryMetrics()
    broker.add_middleware(metrics.messages)
    broker.add_middleware(NatsTelemetryMiddleware(tracer_provider=tracing))
    metrics_server = MetricsServer(settings, metrics.registry, SERVICE)

    async def announce(version: AdapterVersion) -> None:
        await broker.publish(
            envelope(SERVICE, "swarm.adapter.registered", version, subject=version.name),
            subjects.adapter_registered(version.name),
            stream=subjects.adapters_stream,
            # A re-announcement of the same version within the dedup window is stored once.
            headers={"Nats-Msg-Id": f"adapter.{version.name}.{version.version}"},
        )
        metrics.adapter_versions.inc()  # called once per new version

    async def promoted(event: AdapterPromoted) -> None:
        await broker.publish(
            envelope(SERVICE, "swarm.adapter.promoted", event, subject=event.name),
            subjects.adapter_promoted(event.name),
            stream=subjects.adapters_stream,
            headers={
                "Nats-Msg-Id": f"promoted.{event.name}.{event.tenant}.{event.alias}."
                f"{event.previous_version}.{event.version}"
            },
        )
        metrics.promotions.inc()

    async def start() -> None:
        metrics_server.start()
        await broker.connect()
        js = broker.connection.jetstream()
        await ensure_topology(js, subjects, settings.js_replicas)
        store = await asyncio.to_thread(open_store, settings)
        jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)
        catalogs.models = ModelCatalog(await kv_bucket(js, subjects, "models"), store)
        catalogs.adapters = AdapterCatalog(
            await kv_bucket(js, subjects, "adapters"), store, announce, jobs, promoted
        )
        datasets = RecordTable(await kv_bucket(js, subjects, "datasets"), DatasetInfo)
        catalogs.collector = Collector(
            store, catalogs.adapters, catalogs.models.versions, jobs, datasets
        )
        leases = RecordTable(await kv_bucket(js, subjects, "session_leases"), SessionLease)
        catalogs.signer = StoreSigner(store, jobs, datasets, leases)
        catalogs.forks = Forks(store, jobs)

    handlers = Handlers(catalogs, tracer)
    served = [(subjects.registry(r.action.name), r) for r in handlers.routes()]
    served += [(subjects.worker_registry(r.action.name), r) for r in handlers.worker_routes()]
    for subject, r in served:
        broker.subscriber(subject, queue=SERVICE, max_workers=r.workers)(r.handler)

    async def stop() -> None:
        metrics_server.stop()
        tracing.shutdown()

    app = FastStream(broker, on_startup=[start], on_shutdown=[stop])
    app.context.set_global("tracer_provider", tracing)  # tests add their span exporter to it
    app.context.set_global("metrics_server", metrics_server)
    return app

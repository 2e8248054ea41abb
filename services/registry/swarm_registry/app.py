"""The registry's FastStream app: NATS request/reply handlers over the models/adapters buckets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from opentelemetry.trace import Status, StatusCode

from swarm_common.broker import make_broker
from swarm_common.envelope import envelope
from swarm_common.jobs import JobRecord
from swarm_common.prometheus import MetricsServer
from swarm_common.records import RecordTable
from swarm_common.registry import (
    AdapterKey,
    AdapterPromoted,
    AdapterVersion,
    AliasTarget,
    GcReport,
    GetAdapter,
    GetModel,
    LineageGraph,
    ListAdapters,
    ModelVersion,
    PromotionRule,
    RegisterAdapter,
    RegisterModel,
    Reply,
    RunGc,
    SetAlias,
    VerifyReport,
)
from swarm_common.settings import Settings
from swarm_common.store import open_store
from swarm_common.subjects import Subjects
from swarm_common.topology import ensure_topology, kv_bucket
from swarm_common.tracing import setup_tracing, tracer_of
from swarm_registry.adapters import AdapterCatalog
from swarm_registry.errors import RegistryError
from swarm_registry.integrity import verify
from swarm_registry.lineage import lineage_graph
from swarm_registry.metrics import RegistryMetrics
from swarm_registry.models import ModelCatalog
from swarm_registry.retention import Collector, delete_version

log = logging.getLogger(__name__)

SERVICE = "registry"
# Registrations hash and copy files: let a few run at once so one big model does not stall
# every query behind it. Version allocation is compare-and-set, so concurrency is safe.
REGISTER_WORKERS = 4

T = TypeVar("T")


async def answer(reply_type: type[Reply[T]], work: Awaitable[T]) -> Reply[T]:
    """Any failure becomes an error reply: a requester must never be left waiting for a timeout."""
    try:
        return reply_type(ok=True, result=await work)
    except RegistryError as exc:
        return reply_type(ok=False, error=str(exc))
    except Exception as exc:
        log.exception("registry request failed")
        return reply_type(ok=False, error=f"internal error: {type(exc).__name__}: {exc}")


class Catalogs:
    """Filled in at startup, once the broker is connected and the buckets exist."""

    models: ModelCatalog
    adapters: AdapterCatalog
    collector: Collector


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
        await ensure_topology(js, subjects)
        store = await asyncio.to_thread(open_store, settings)
        jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)
        catalogs.models = ModelCatalog(await kv_bucket(js, subjects, "models"), store)
        catalogs.adapters = AdapterCatalog(
            await kv_bucket(js, subjects, "adapters"), store, announce, jobs, promoted
        )
        catalogs.collector = Collector(store, catalogs.adapters, catalogs.models.versions, jobs)

    def subject(action: str) -> str:
        return subjects.registry(action)

    @broker.subscriber(subject("models.register"), queue=SERVICE, max_workers=REGISTER_WORKERS)
    async def register_model(request: RegisterModel) -> Reply[ModelVersion]:
        return await answer(Reply[ModelVersion], catalogs.models.register(request))

    @broker.subscriber(subject("models.get"), queue=SERVICE)
    async def get_model(request: GetModel) -> Reply[ModelVersion]:
        return await answer(Reply[ModelVersion], catalogs.models.get(request))

    @broker.subscriber(subject("models.list"), queue=SERVICE)
    async def list_models() -> Reply[list[ModelVersion]]:
        return await answer(Reply[list[ModelVersion]], catalogs.models.list())

    @broker.subscriber(subject("adapters.register"), queue=SERVICE, max_workers=REGISTER_WORKERS)
    async def register_adapter(request: RegisterAdapter) -> Reply[AdapterVersion]:
        lineage = request.lineage
        with tracer.start_as_current_span(
            "registry.register_adapter",
            attributes={
                "swarm.job_id": lineage.job_id,
                "swarm.attempt": lineage.attempt,
                "swarm.adapter": request.name,
            },
        ) as span:
            reply = await answer(Reply[AdapterVersion], catalogs.adapters.register(request))
            if reply.result is not None:
                span.set_attribute("swarm.adapter_version", reply.result.version)
            else:
                span.set_status(Status(StatusCode.ERROR, (reply.error or "")[:200]))
            return reply

    @broker.subscriber(subject("adapters.get"), queue=SERVICE)
    async def get_adapter(request: GetAdapter) -> Reply[AdapterVersion]:
        return await answer(Reply[AdapterVersion], catalogs.adapters.get(request))

    @broker.subscriber(subject("adapters.list"), queue=SERVICE)
    async def list_adapters(request: ListAdapters) -> Reply[list[AdapterVersion]]:
        return await answer(Reply[list[AdapterVersion]], catalogs.adapters.list(request))

    @broker.subscriber(subject("adapters.delete"), queue=SERVICE)
    async def delete_adapter(request: AdapterKey) -> Reply[AdapterVersion]:
        return await answer(Reply[AdapterVersion], delete_version(catalogs.adapters, request))

    @broker.subscriber(subject("adapters.verify"), queue=SERVICE, max_workers=REGISTER_WORKERS)
    async def verify_adapter(request: AdapterKey) -> Reply[VerifyReport]:
        async def work() -> VerifyReport:
            record = await catalogs.adapters.get(
                GetAdapter(name=request.name, version=request.version, tenant=request.tenant)
            )
            return await asyncio.to_thread(verify, catalogs.adapters.store, record)

        return await answer(Reply[VerifyReport], work())

    @broker.subscriber(subject("adapters.lineage"), queue=SERVICE)
    async def adapter_lineage(request: AdapterKey) -> Reply[LineageGraph]:
        work = lineage_graph(catalogs.adapters, request.name, request.version, request.tenant)
        return await answer(Reply[LineageGraph], work)

    @broker.subscriber(subject("adapters.alias.set"), queue=SERVICE)
    async def set_alias(request: SetAlias) -> Reply[AliasTarget]:
        async def work() -> AliasTarget:
            record = await catalogs.adapters.get(
                GetAdapter(name=request.name, version=request.version, tenant=request.tenant)
            )
            return await catalogs.adapters.aliases.set(record, request.alias)

        return await answer(Reply[AliasTarget], work())

    @broker.subscriber(subject("adapters.rule.set"), queue=SERVICE)
    async def set_rule(request: PromotionRule) -> Reply[PromotionRule]:
        return await answer(Reply[PromotionRule], catalogs.adapters.aliases.set_rule(request))

    @broker.subscriber(subject("gc.run"), queue=SERVICE)
    async def run_gc(request: RunGc) -> Reply[GcReport]:
        return await answer(Reply[GcReport], catalogs.collector.run(request))

    async def stop() -> None:
        metrics_server.stop()
        tracing.shutdown()

    app = FastStream(broker, on_startup=[start], on_shutdown=[stop])
    app.context.set_global("tracer_provider", tracing)  # tests add their span exporter to it
    app.context.set_global("metrics_server", metrics_server)
    return app

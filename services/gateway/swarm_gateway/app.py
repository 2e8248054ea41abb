"""The FastAPI application: a plain app that owns a FastStream NatsBroker in its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.errors
from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse, Response
from nats.js.errors import Error as JetStreamError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from swarm_common.broker import make_broker
from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobRecord
from swarm_common.prometheus import otlp_bridge
from swarm_common.records import RecordTable
from swarm_common.settings import Settings
from swarm_common.store import open_store
from swarm_common.subjects import Subjects
from swarm_common.topology import ensure_topology, kv_bucket
from swarm_common.tracing import setup_tracing, tracer_of
from swarm_common.workers import WorkerInfo
from swarm_gateway import dashboard
from swarm_gateway.auth import parse_api_keys
from swarm_gateway.errors import ServiceUnavailable
from swarm_gateway.prometheus import GatewayMetrics, MetricsMiddleware
from swarm_gateway.routes import adapters, datasets, jobs, models, workers
from swarm_gateway.state import Gateway

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    submit_wait_s: float = 5.0,
    request_timeout_s: float = 5.0,
) -> FastAPI:
    settings = settings or Settings()
    subjects = Subjects(settings.namespace)
    api_keys = parse_api_keys(settings.api_keys, settings.admin_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        broker = make_broker(settings, "gateway")
        await broker.start()
        nc = broker.connection
        js = nc.jetstream()
        await ensure_topology(js, subjects)
        app.state.gateway = Gateway(
            settings=settings,
            subjects=subjects,
            broker=broker,
            nc=nc,
            js=js,
            jobs=RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord),
            datasets=RecordTable(await kv_bucket(js, subjects, "datasets"), DatasetInfo),
            workers=RecordTable(await kv_bucket(js, subjects, "workers"), WorkerInfo),
            store=open_store(settings),
            submit_wait_s=submit_wait_s,
            request_timeout_s=request_timeout_s,
            metrics=metrics,
            tracer=tracer_of(tracing, "gateway"),
        )
        log.info("gateway connected to %s (namespace %r)", settings.nats_url, settings.namespace)
        otlp = otlp_bridge(settings, metrics.registry, "gateway")
        try:
            yield
        finally:
            await broker.stop()
            tracing.shutdown()
            if otlp is not None:
                otlp.shutdown()

    app = FastAPI(
        title="Swarm gateway",
        version="1",
        description="Submit and follow LoRA fine-tuning jobs; manage datasets, models, adapters.",
        lifespan=lifespan,
    )
    app.state.api_keys = api_keys
    # Made here, not in the lifespan, so that a test can add its span exporter before start.
    tracing = setup_tracing(settings, "gateway")
    app.state.tracer_provider = tracing
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(_: Request, exc: ServiceUnavailable) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.message}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE
        )

    # Anything NATS raises that a route did not map itself is still an outage, not a bug.
    @app.exception_handler(nats.errors.Error)
    @app.exception_handler(JetStreamError)
    async def _nats_down(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"NATS unavailable: {exc!r}"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        )

    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request) -> JSONResponse:
        gw: Gateway | None = getattr(request.app.state, "gateway", None)
        connected = bool(gw and gw.nc.is_connected)
        return JSONResponse(
            {"status": "ok" if connected else "degraded", "nats": connected},
            status_code=status.HTTP_200_OK if connected else status.HTTP_503_SERVICE_UNAVAILABLE,
        )

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    for module in (jobs, datasets, models, adapters, workers):
        app.include_router(module.router)
    app.include_router(dashboard.router)
    return app

"""The FastAPI application: a plain app that owns a FastStream NatsBroker in its lifespan."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import nats.errors
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from nats.js.errors import Error as JetStreamError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.jobs import JobRecord
from swarm_contracts.subjects import Subjects
from swarm_contracts.sweeps import SweepRecord, TrialRecord
from swarm_contracts.workers import WorkerInfo, WorkerOps
from swarm_gateway import dashboard, openapi_doc
from swarm_gateway.auth import parse_api_keys
from swarm_gateway.errors import STATUS_OF_CODE
from swarm_gateway.fine_tune_records import FineTune
from swarm_gateway.inference_workers import InferenceWorkers
from swarm_gateway.methods import MethodsMiddleware, route_operations
from swarm_gateway.openai_errors import (
    OpenAIError,
    is_openai,
    on_http_error,
    on_openai_error,
    on_server_error,
    on_validation_error,
)
from swarm_gateway.prometheus import GatewayMetrics, MetricsMiddleware
from swarm_gateway.responses import FiniteJSONResponse
from swarm_gateway.routes import (
    adapters,
    datasets,
    fine_tuning,
    jobs,
    models,
    openai,
    openai_files,
    sweeps,
    tinker,
    tinker_overview,
    tinker_sampling,
    workers,
)
from swarm_gateway.settings import GatewaySettings
from swarm_gateway.state import Gateway
from swarm_gateway.tinker import sessions
from swarm_gateway.tinker.calls import Calls
from swarm_gateway.tinker.follow_ups import FollowUps
from swarm_gateway.tinker.records import (
    FutureRecord,
    ModelRecord,
    SamplerRecord,
    SessionRecord,
    model_token,
)
from swarm_runtime.broker import make_broker
from swarm_runtime.prometheus import otlp_bridge
from swarm_runtime.record_cache import RecordCache
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused, Unavailable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_runtime.tracing import setup_tracing, tracer_of

log = logging.getLogger(__name__)

AUTH_OFF_WARNING = (
    "AUTH IS OFF: SWARM_API_KEYS and SWARM_ADMIN_KEYS are both empty, so every caller is tenant "
    "'default' with ADMIN rights (sees every job and worker, curates base models). Fine for "
    "`swarm up` on loopback; set API keys before this gateway is reachable by anyone else "
    "(docs/security.md)."
)


# The one place where the services' answers become HTTP statuses.
# (On the OpenAI-compatible routes in OpenAI's error shape: swarm_gateway.openai_errors.)
async def on_refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    if is_openai(request):
        return OpenAIError(STATUS_OF_CODE[exc.code], exc.message).response()
    return FiniteJSONResponse({"detail": exc.message}, status_code=STATUS_OF_CODE[exc.code])


async def on_unavailable(request: Request, exc: Exception) -> Response:
    if is_openai(request):
        return OpenAIError(503, str(exc), code="service_unavailable").response()
    return FiniteJSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


async def on_nats_down(request: Request, exc: Exception) -> Response:
    # Anything NATS raises that a route did not map itself is still an outage, not a bug.
    if is_openai(request):
        return OpenAIError(503, f"NATS unavailable: {exc!r}", code="service_unavailable").response()
    return FiniteJSONResponse(
        {"detail": f"NATS unavailable: {exc!r}"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def add_service_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Refused, on_refused)
    app.add_exception_handler(Unavailable, on_unavailable)
    app.add_exception_handler(nats.errors.Error, on_nats_down)
    app.add_exception_handler(JetStreamError, on_nats_down)


def create_app(
    settings: Settings | None = None,
    *,
    submit_wait_s: float = 5.0,
    request_timeout_s: float = 5.0,
    event_stream_max_s: float | None = None,
) -> FastAPI:
    """The gateway's app; ``settings`` may be the shared ones (its own read from the
    environment) or ``GatewaySettings``; none: all from the environment."""
    settings = GatewaySettings.of(settings or Settings())
    subjects = Subjects(settings.namespace)
    api_keys = parse_api_keys(settings.api_keys, settings.admin_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        broker = make_broker(settings, "gateway")
        await broker.start()
        nc = broker.connection
        js = nc.jetstream()
        await ensure_topology(js, subjects, settings.js_replicas)
        inference_workers = InferenceWorkers(subjects, settings.heartbeat_interval_s)
        await inference_workers.start(nc)
        jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)
        job_list = RecordCache(jobs)
        await job_list.start()
        # The gateway's own bucket (swarm_gateway.fine_tune_records): no other service reads it.
        fine_tunes = RecordTable(
            await kv_bucket(js, subjects, "openai_jobs", settings.js_replicas), FineTune
        )
        fine_tune_list = RecordCache(fine_tunes)
        await fine_tune_list.start()
        app.state.gateway = Gateway(
            settings=settings,
            subjects=subjects,
            broker=broker,
            nc=nc,
            js=js,
            jobs=jobs,
            job_list=job_list,
            datasets=RecordTable(await kv_bucket(js, subjects, "datasets"), DatasetInfo),
            dataset_uploads=RecordTable(
                await kv_bucket(js, subjects, "dataset_uploads"), DatasetUpload
            ),
            workers=RecordTable(await kv_bucket(js, subjects, "workers"), WorkerInfo),
            worker_ops=RecordTable(await kv_bucket(js, subjects, "worker_ops"), WorkerOps),
            sweeps=RecordTable(await kv_bucket(js, subjects, "sweeps"), SweepRecord),
            trials=RecordTable(await kv_bucket(js, subjects, "trials"), TrialRecord),
            store=open_store(settings),
            submit_wait_s=submit_wait_s,
            request_timeout_s=request_timeout_s,
            event_stream_max_s=event_stream_max_s,
            metrics=metrics,
            tracer=tracer_of(tracing, "gateway"),
            inference_workers=inference_workers,
            fine_tunes=fine_tunes,
            fine_tune_list=fine_tune_list,
        )
        # The Tinker training API's own buckets and its calls to workers (routes.tinker).
        futures = RecordTable(await kv_bucket(js, subjects, "tinker_futures"), FutureRecord)
        calls = Calls(nc, subjects, futures)
        await calls.start()
        models = RecordTable(await kv_bucket(js, subjects, "tinker_models"), ModelRecord)
        model_list = RecordCache(models)
        await model_list.start()
        app.state.tinker = tinker.Tables(
            sessions=RecordTable(await kv_bucket(js, subjects, "tinker_sessions"), SessionRecord),
            models=models,
            futures=futures,
            calls=calls,
            samplers=RecordTable(await kv_bucket(js, subjects, "tinker_samplers"), SamplerRecord),
            model_list=model_list,
        )

        async def restore(future: FutureRecord) -> str | None:
            # A call no worker heard: its model is built again on another worker (a create
            # call moves there itself).
            token, lost = model_token(future.model_id), future.worker_id or ""
            moving = future if future.op == "create" else None
            return await sessions.restore(app.state.gateway, models, calls, token, lost, moving)

        calls.on_lost = restore
        calls.follow_up = FollowUps(models, app.state.tinker.samplers, app.state.gateway.registry)
        calls.resample = functools.partial(
            tinker_sampling.resample, app.state.gateway, app.state.tinker
        )

        def timed(future: FutureRecord) -> None:
            total = (future.done_at or time.time()) - future.sent_at
            compute = future.result.compute_s if future.result is not None else None
            metrics.tinker_settled(future.op, future.state, future.tenant, total, compute)

        calls.on_timed = timed
        log.info("gateway connected to %s (namespace %r)", settings.nats_url, settings.namespace)
        if not api_keys:
            log.warning(AUTH_OFF_WARNING)
        otlp = otlp_bridge(settings, metrics.registry, "gateway")
        try:
            yield
        finally:
            await job_list.stop()
            await fine_tune_list.stop()
            await model_list.stop()
            with contextlib.suppress(nats.errors.Error):
                await calls.stop()
            # Samples still running: their futures read as failed at their deadline.
            await cancel_and_wait(list(app.state.tinker.tasks))
            # Validations still running: their uploads stay "validating"; the client uploads again.
            await cancel_and_wait(list(app.state.gateway.background))
            await inference_workers.stop()
            # Stopping while NATS is away (nats-py refuses to drain a reconnecting
            # connection) must still stop the gateway.
            with contextlib.suppress(nats.errors.Error):
                await broker.stop()
            tracing.shutdown()
            if otlp is not None:
                otlp.shutdown()

    app = FastAPI(
        title="Swarm gateway",
        version="1",
        description=(
            "Submit and follow LoRA fine-tuning jobs and hyperparameter sweeps; manage datasets, "
            "models, adapters; OpenAI-compatible chat and text completions with base models and "
            "adapters."
        ),
        lifespan=lifespan,
        default_response_class=FiniteJSONResponse,
    )
    app.state.api_keys = api_keys
    # Made here, not in the lifespan, so that a test can add its span exporter before start.
    tracing = setup_tracing(settings, "gateway")
    app.state.tracer_provider = tracing
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    add_service_error_handlers(app)

    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request) -> FiniteJSONResponse:
        gw: Gateway | None = getattr(request.app.state, "gateway", None)
        connected = bool(gw and gw.nc.is_connected)
        return FiniteJSONResponse(
            {"status": "ok" if connected else "degraded", "nats": connected},
            status_code=status.HTTP_200_OK if connected else status.HTTP_503_SERVICE_UNAVAILABLE,
        )

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # OpenAI's error shape on the OpenAI-compatible routes, FastAPI's everywhere else.
    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_server_error)

    for router, kind in (
        (jobs.router, "jobs"),
        (sweeps.router, "sweeps"),
        (datasets.router, "datasets"),
        (models.router, "models"),
        (adapters.router, "adapters"),
        (workers.router, "workers"),
        (workers.inference_router, "workers"),
        (openai.router, "inference"),
        (openai_files.router, "openai"),
        (fine_tuning.router, "openai"),
        (tinker.router, "tinker"),
        (tinker_sampling.router, "tinker"),
        (tinker_overview.router, "tinker_overview"),
    ):
        app.include_router(router, responses=openapi_doc.responses(kind))
    app.include_router(dashboard.router)

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = openapi_doc.add_links(FastAPI.openapi(app))
            document = openapi_doc.add_business_rules(openapi_doc.add_security(document))
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    app.add_middleware(MethodsMiddleware, operations=lambda: route_operations(app.routes))
    return app

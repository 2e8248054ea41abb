"""The telemetry service: a FastStream consumer of the job events plus an HTTP server."""

from __future__ import annotations

import logging
from typing import Annotated

import uvicorn
from fastapi import FastAPI
from faststream import AckPolicy, FastStream
from faststream.nats import JStream, NatsBroker
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from pydantic import Field, TypeAdapter, ValidationError

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import AnyJobEvent, JobEvent
from swarm_contracts.metrics import GET_JOB_METRICS, GetJobMetrics, JobMetrics
from swarm_contracts.replies import Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker
from swarm_runtime.rpc import Refused, answer
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology
from swarm_telemetry.http_api import build_http
from swarm_telemetry.otel_metrics import OtelMetrics
from swarm_telemetry.prometheus_metrics import PrometheusMetrics
from swarm_telemetry.series import SeriesStore
from swarm_telemetry.settings import TelemetrySettings

log = logging.getLogger(__name__)

SERVICE = "telemetry"
JobEventEnvelope = TypeAdapter(
    CloudEvent[Annotated[AnyJobEvent, Field(discriminator="event")]]  # type: ignore[maybe-unrecognized-str-typeform]
)


class TelemetryService:
    """Series, exporters, the FastStream app and the HTTP app of one telemetry instance."""

    def __init__(self, settings: Settings) -> None:
        """``settings``: the shared ones (its own read from the environment) or
        ``TelemetrySettings``."""
        self.settings = settings = TelemetrySettings.of(settings)
        self.subjects = Subjects(settings.namespace)
        self.series = SeriesStore()
        self.prometheus = PrometheusMetrics(self.series)
        self.otel = OtelMetrics(settings)
        self.broker: NatsBroker = make_broker(settings, SERVICE)
        self.app = FastStream(
            self.broker, on_startup=[self._ensure_topology], after_shutdown=[self.otel.shutdown]
        )
        self.http: FastAPI = build_http(self.series, self.prometheus)
        self.server: uvicorn.Server | None = None
        self._subscribe()

    async def _ensure_topology(self) -> None:
        # The events stream must exist before the consumer on it is created.
        await self.broker.connect()
        js = self.broker.connection.jetstream()
        await ensure_topology(js, self.subjects, self.settings.js_replicas)

    def consume(self, event: JobEvent) -> None:
        self.series.apply(event)
        self.prometheus.record(event)
        self.otel.record(event)

    def _subscribe(self) -> None:
        subjects = self.subjects

        # An ordered consumer from the first message: every start replays the whole stream, so
        # the in-memory series come back after a restart, and no consumer state is left on the
        # server. Nothing to ack (ack policy none): the stream, not this process, is the record.
        @self.broker.subscriber(
            subjects.job_event(),
            stream=JStream(subjects.events_stream, declare=False),
            deliver_policy=DeliverPolicy.ALL,
            ordered_consumer=True,
            idle_heartbeat=5.0,
            ack_policy=AckPolicy.MANUAL,
        )
        async def on_job_event(message: NatsMessage) -> None:
            try:
                envelope = JobEventEnvelope.validate_json(message.body)
            except ValidationError as exc:
                # Not dead-lettered: this consumer replays the stream at every start and would
                # park the same message again each time; the stream keeps it for inspection.
                log.warning(
                    "skipping invalid job event on %s: %s", message.raw_message.subject, exc
                )
                self.prometheus.record_invalid()
                return
            self.consume(envelope.data)

        @self.broker.subscriber(subjects.telemetry(GET_JOB_METRICS.name), queue=SERVICE)
        async def get_metrics(request: GetJobMetrics) -> Reply[JobMetrics]:
            async def work() -> JobMetrics:
                metrics = self.series.get(request.job_id, request.max_points)
                if metrics is None:
                    raise Refused(f"unknown job {request.job_id!r}", "not_found")
                return metrics

            return await answer(Reply[JobMetrics], work())

    async def run(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn handles the signals), then stop the consumer."""
        self.server = server = uvicorn.Server(
            uvicorn.Config(
                self.http,
                host=self.settings.telemetry_host,
                port=self.settings.telemetry_port,
                log_level=self.settings.log_level.lower(),
                lifespan="off",
            )
        )
        await self.app.start()
        try:
            await server.serve()
        finally:
            await self.app.stop()

    def exit(self) -> None:
        """Ask a running ``run()`` to return, as SIGTERM would."""
        if self.server is not None:
            self.server.should_exit = True


def build_app(settings: Settings) -> TelemetryService:
    return TelemetryService(settings)

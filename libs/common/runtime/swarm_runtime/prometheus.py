"""Prometheus for the services without an HTTP API of their own (scheduler, registry, trainer):
a ``/metrics`` server per app, NATS message rates and durations from FastStream, and the same
numbers over OTLP when ``SWARM_OTEL_EXPORTER`` asks for it.

Every app has its own ``CollectorRegistry``, so several apps in one process (tests) never
collide. Names follow Prometheus conventions: ``swarm_<service>_…``, base units, ``_total``
counters, and no job ids in labels (subjects are reduced to their templates).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Any

from faststream.nats.prometheus.provider import (
    NatsMetricsSettingsProvider,
    settings_provider_factory,
)
from faststream.prometheus import ConsumeAttrs
from faststream.prometheus.middleware import PrometheusMiddleware
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, start_http_server

from swarm_runtime.settings import Settings

log = logging.getLogger(__name__)

# Subject tokens that name one job, worker, adapter, sweep or inference request: unbounded, so
# never a label value. (Base model names in swarm.inference.<base>.<version>.generate are a
# catalog.)
_VARIABLE_AFTER = {
    "jobs": "job",
    "workers": "worker",
    "adapters": "name",
    "sweeps": "sweep",
    "requests": "request",
    # swarm.workers.<worker>.events.<job>.<event>: a worker's job events
    "events": "job",
}
_FIXED = {"submit"}


@functools.lru_cache(maxsize=4096)  # per message on busy subjects (heartbeats): worth caching
def subject_template(subject: str) -> str:
    """``swarm.jobs.job-1a2b.events.progress`` -> ``swarm.jobs.{job}.events.progress``."""
    tokens = subject.split(".")
    if "registry" in tokens or "trainer" in tokens:
        # Request/reply APIs: a fixed set of subjects, but for the worker that asks on its
        # own subject (swarm.workers.<worker>.registry.<action>).
        for i in range(len(tokens) - 2):
            if tokens[i : i + 2] == ["swarm", "workers"] and tokens[i + 2] not in ("*", ">"):
                tokens[i + 2] = "{worker}"
        return ".".join(tokens)
    for i in range(len(tokens) - 1):
        placeholder = _VARIABLE_AFTER.get(tokens[i])
        nxt = tokens[i + 1]
        if placeholder and nxt not in _FIXED and nxt not in ("*", ">") and i + 2 < len(tokens):
            tokens[i + 1] = "{" + placeholder + "}"
    # Inbox replies (request/reply) carry a random token each.
    return re.sub(r"^_INBOX\..*", "_INBOX", ".".join(tokens))


class _TemplatedProvider(NatsMetricsSettingsProvider):
    def get_consume_attrs_from_message(self, msg: Any) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = subject_template(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return subject_template(super().get_publish_destination_name_from_cmd(cmd))


def _templated_provider_factory(msg: Any) -> Any:
    provider = settings_provider_factory(msg)
    # Batches (unused by Swarm) keep FastStream's own provider.
    return _TemplatedProvider() if isinstance(provider, NatsMetricsSettingsProvider) else provider


def nats_metrics_middleware(registry: CollectorRegistry, service: str) -> PrometheusMiddleware:
    """FastStream's Prometheus middleware, named ``swarm_<service>_received_messages_total``,
    ``…_received_processed_messages_duration_seconds``, ``…_published_messages_total`` etc.,
    labelled by subject template rather than subject."""
    return PrometheusMiddleware(
        settings_provider_factory=_templated_provider_factory,
        registry=registry,
        app_name=service,
        metrics_prefix=f"swarm_{service}",
    )


OTLP_EXPORT_INTERVAL_MS = 10_000


def metric_exporter_for(settings: Settings) -> MetricExporter | None:
    """The OpenTelemetry metric exporter ``SWARM_OTEL_EXPORTER`` asks for (none: None)."""
    if settings.otel_exporter == "console":
        return ConsoleMetricExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=settings.otlp_url("metrics"))
    return None


class OtlpBridge:
    """The numbers ``/metrics`` serves, pushed over OpenTelemetry as well.

    One registry stays the source of truth: each Prometheus family becomes an observable
    instrument that reads the registry when the reader collects (counters as monotonic sums
    named ``…_total``, gauges as gauges, histograms as their ``_count`` and ``_sum``; OTel has
    no way to observe pre-bucketed histograms). Families registered after start are not
    exported: every Swarm service registers its metrics when its app is built.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        service: str,
        reader: MetricReader,
    ) -> None:
        self.registry = registry
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": f"swarm-{service}"}),
            metric_readers=[reader],
        )
        meter = self.provider.get_meter(f"swarm_{service}")
        for family in registry.collect():
            if family.type == "counter":
                meter.create_observable_counter(
                    family.name + "_total",
                    [self._reader(family.name + "_total")],
                    description=family.documentation,
                )
            elif family.type == "gauge":
                meter.create_observable_gauge(
                    family.name, [self._reader(family.name)], description=family.documentation
                )
            elif family.type in ("histogram", "summary"):
                for part in ("_count", "_sum"):
                    meter.create_observable_counter(
                        family.name + part,
                        [self._reader(family.name + part)],
                        description=family.documentation,
                    )

    def _reader(self, sample_name: str) -> Any:
        def observe(_: CallbackOptions) -> list[Observation]:
            return [
                Observation(sample.value, dict(sample.labels))
                for family in self.registry.collect()
                for sample in family.samples
                if sample.name == sample_name
            ]

        return observe

    def shutdown(self) -> None:
        self.provider.shutdown()


def otlp_bridge(settings: Settings, registry: CollectorRegistry, service: str) -> OtlpBridge | None:
    """An ``OtlpBridge`` exporting every ``OTLP_EXPORT_INTERVAL_MS`` when ``SWARM_OTEL_EXPORTER``
    asks for one; None otherwise."""
    exporter = metric_exporter_for(settings)
    if exporter is None:
        return None
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=OTLP_EXPORT_INTERVAL_MS)
    return OtlpBridge(registry, service, reader)


class MetricsServer:
    """``/metrics`` for one registry on ``SWARM_METRICS_HOST:SWARM_METRICS_PORT``.

    No port configured (the default) serves nothing; port 0 takes a free one (``self.port``
    says which, and it is logged). A port already in use is logged, not fatal: metrics are
    not worth refusing to run for.
    """

    def __init__(self, settings: Settings, registry: CollectorRegistry, service: str) -> None:
        self.host = settings.metrics_host
        self.port = settings.metrics_port
        self.registry = registry
        self.service = service
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.settings = settings
        self.otlp: OtlpBridge | None = None

    def start(self) -> None:
        if self.otlp is None:
            self.otlp = otlp_bridge(self.settings, self.registry, self.service)
        if self.port is None or self._server is not None:
            return
        try:
            self._server, self._thread = start_http_server(
                self.port, addr=self.host, registry=self.registry
            )
        except OSError as exc:
            log.warning(
                "%s: cannot serve /metrics on %s:%s: %s", self.service, self.host, self.port, exc
            )
            return
        self.port = self._server.server_port
        log.info("%s serves /metrics on http://%s:%d/metrics", self.service, self.host, self.port)

    def stop(self) -> None:
        if self.otlp is not None:
            self.otlp.shutdown()
            self.otlp = None
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None

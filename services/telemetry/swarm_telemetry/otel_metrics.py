"""OpenTelemetry metrics, exported as ``settings.otel_exporter`` says (none|console|otlp)."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from swarm_contracts.events import JobEvent, Progress, Validated
from swarm_runtime.prometheus import metric_exporter_for
from swarm_runtime.settings import Settings

EXPORT_INTERVAL_MS = 10_000


class OtelMetrics:
    """A provider of its own rather than the global one, so it can be shut down with the app."""

    def __init__(self, settings: Settings) -> None:
        exporter = metric_exporter_for(settings)
        readers = (
            [PeriodicExportingMetricReader(exporter, export_interval_millis=EXPORT_INTERVAL_MS)]
            if exporter
            else []
        )
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": "swarm-telemetry"}), metric_readers=readers
        )
        meter = self.provider.get_meter("swarm_telemetry")
        self.events = meter.create_counter(
            "swarm.telemetry.events", unit="{event}", description="Job events consumed"
        )
        self.step_loss = meter.create_histogram(
            "swarm.training.step_loss", unit="1", description="Training loss per progress event"
        )
        self.eval_loss = meter.create_histogram(
            "swarm.training.eval_loss", unit="1", description="Validation loss per eval"
        )
        self.tokens = meter.create_histogram(
            "swarm.training.throughput", unit="{token}/s", description="Training tokens per second"
        )

    def record(self, event: JobEvent) -> None:
        self.events.add(1, {"event": event.event})
        if isinstance(event, Progress):
            self.step_loss.record(event.loss)
            self.tokens.record(event.tokens_per_s)
        elif isinstance(event, Validated):
            self.eval_loss.record(event.eval_loss)

    def shutdown(self) -> None:
        self.provider.shutdown()

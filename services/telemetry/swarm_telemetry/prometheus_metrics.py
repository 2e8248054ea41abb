"""Prometheus instruments: ``swarm_`` names, base units, no job ids as labels (unbounded)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from swarm_contracts.events import JobEvent, Progress
from swarm_telemetry.series import SeriesStore

LOSS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


class SeriesCollector(Collector):
    """Gauges read from the series at scrape time, so they can never drift from them."""

    def __init__(self, series: SeriesStore) -> None:
        self.series = series

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "swarm_telemetry_jobs",
            "Jobs seen in the events stream, by last state",
            labels=["state"],
        )
        for state, count in self.series.count_by_state().items():
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily(
            "swarm_training_tokens_per_second",
            "Training throughput summed over running jobs (latest progress of each)",
            value=self.series.running_tokens_per_s(),
        )


class PrometheusMetrics:
    """One registry per service instance: several instances can live in one test process."""

    def __init__(self, series: SeriesStore) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "swarm_telemetry_events",
            "Job events consumed, by event name",
            ["event"],
            registry=self.registry,
        )
        self.invalid_events = Counter(
            "swarm_telemetry_invalid_events",
            "Messages on the job events subjects that are not a valid job event",
            registry=self.registry,
        )
        self.training_steps = Counter(
            "swarm_training_steps", "Training steps reported", registry=self.registry
        )
        self.step_loss = Histogram(
            "swarm_training_step_loss",
            "Training loss reported with each progress event",
            buckets=LOSS_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(SeriesCollector(series))

    def record(self, event: JobEvent) -> None:
        self.events.labels(event=event.event).inc()
        if isinstance(event, Progress):
            self.training_steps.inc()
            self.step_loss.observe(event.loss)

    def record_invalid(self) -> None:
        self.invalid_events.inc()

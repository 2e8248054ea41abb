"""The scheduler's Prometheus metrics: queue, placements and the worker table."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from swarm_contracts.jobs import JobRecord, JobState, utcnow
from swarm_runtime.intake import IntakeMetrics
from swarm_runtime.prometheus import nats_metrics_middleware
from swarm_scheduler.view import JobView
from swarm_scheduler.worker_table import WorkerTable

# Placement latency spans a sub-second pass on an idle cluster to hours in a full one.
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)


class _StateCollector(Collector):
    """Gauges read from the scheduler's live view at scrape time: never out of step with it."""

    def __init__(self, view: JobView, workers: WorkerTable, leading: Callable[[], bool]) -> None:
        self.view, self.workers, self.leading = view, workers, leading

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued = Tally(
            r.spec.priority for r in list(self.view.open.values()) if r.state == JobState.queued
        )
        depth = GaugeMetricFamily(
            "swarm_scheduler_queue_depth",
            "Jobs waiting to be placed, by priority",
            labels=["priority"],
        )
        for priority, count in sorted(queued.items()):
            depth.add_metric([str(priority)], count)
        yield depth

        states = Tally(r.state.value for r in list(self.view.open.values()))
        jobs = GaugeMetricFamily(
            "swarm_scheduler_open_jobs", "Jobs not yet finished, by state", labels=["state"]
        )
        for state in (s for s in JobState if not s.terminal):
            jobs.add_metric([state.value], states.get(state.value, 0))
        yield jobs

        workers = GaugeMetricFamily(
            "swarm_scheduler_workers", "Workers in the worker table, by state", labels=["state"]
        )
        for worker_state, count in self.workers.count_by_state().items():
            workers.add_metric([worker_state], count)
        yield workers

        yield GaugeMetricFamily(
            "swarm_scheduler_leader",
            "1 while this scheduler process is the leader",
            value=1.0 if self.leading() else 0.0,
        )


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.placements = Counter(
            "swarm_scheduler_placements_total",
            "Job attempts assigned to a worker",
            registry=self.registry,
        )
        self.placement_latency = Histogram(
            "swarm_scheduler_placement_latency_seconds",
            "From a job's submission to its first assignment to a worker",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Verification (swarm_scheduler.verification): overhead = replayed ÷ verified job steps.
        self.verifications = Counter(
            "swarm_scheduler_verifications_total",
            "Replays of finished jobs judged, by outcome (passed, failed, error)",
            ["outcome"],
            registry=self.registry,
        )
        self.replayed_steps = Counter(
            "swarm_scheduler_replayed_steps_total",
            "Training steps replayed to verify jobs",
            registry=self.registry,
        )
        self.verified_job_steps = Counter(
            "swarm_scheduler_verified_job_steps_total",
            "Training steps of the jobs those replays verified (the overhead's denominator)",
            registry=self.registry,
        )
        # The intakes' families first: FastStream's middleware then counts into them.
        self.intakes = IntakeMetrics(self.registry, "scheduler")
        self.messages = nats_metrics_middleware(self.registry, "scheduler")

    def watch(self, view: JobView, workers: WorkerTable, leading: Callable[[], bool]) -> None:
        self.registry.register(_StateCollector(view, workers, leading))

    def verified(self, outcome: str, replayed_steps: int, job_steps: int) -> None:
        self.verifications.labels(outcome=outcome).inc()
        self.replayed_steps.inc(replayed_steps)
        self.verified_job_steps.inc(job_steps)

    def placed(self, record: JobRecord) -> None:
        """``record`` as it was queued, just before its assignment."""
        self.placements.inc()
        if record.attempt == 0:
            # First attempts only: a requeued job's record keeps no time of its requeue.
            waited = (utcnow() - record.created_at).total_seconds()
            self.placement_latency.observe(max(0.0, waited))

"""The sweeps service's Prometheus metrics: sweeps running, trials ended, leadership."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from swarm_contracts.sweeps import TrialState
from swarm_runtime.intake import IntakeMetrics
from swarm_runtime.prometheus import nats_metrics_middleware
from swarm_sweeps.controller import Controller


class _StateCollector(Collector):
    """Gauges read from the controller at scrape time."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = list(self.controller.live.values())
        yield GaugeMetricFamily(
            "swarm_sweeps_running", "Sweeps this leader is running", value=len(live)
        )
        yield GaugeMetricFamily(
            "swarm_sweeps_trials_in_flight",
            "Trials of running sweeps whose jobs have not ended",
            value=sum(len(s.active()) for s in live),
        )
        yield GaugeMetricFamily(
            "swarm_sweeps_leader",
            "1 while this process leads (runs the sweeps), else 0",
            value=1 if self.controller.leading else 0,
        )


class SweepsMetrics:
    def __init__(self, controller: Controller) -> None:
        self.registry = CollectorRegistry()
        # The intakes' families first: FastStream's middleware then counts into them.
        self.intakes = IntakeMetrics(self.registry, "sweeps")
        self.messages = nats_metrics_middleware(self.registry, "sweeps")
        self.trials = Counter(
            "swarm_sweeps_trials_ended",
            "Trials ended, by how (succeeded, pruned, failed, cancelled)",
            ["state"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(controller))
        controller.on_trial_end = self.trial_ended

    def trial_ended(self, state: TrialState) -> None:
        self.trials.labels(state=state.value).inc()

"""The inference worker's Prometheus metrics: requests, tokens, time to first token, and the
batch each held base model is running."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from swarm_inference.engine import EngineStats
from swarm_runtime.prometheus import nats_metrics_middleware

# What each held base model's engine is doing now: (``name@version``, its stats).
StatsSource = Callable[[], list[tuple[str, EngineStats]]]
SERVICE = "inference"


class _EngineCollector(Collector):
    def __init__(self, stats: StatsSource) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "running": GaugeMetricFamily(
                "swarm_inference_batch_rows", "Rows in the running batch", labels=["model"]
            ),
            "queued": GaugeMetricFamily(
                "swarm_inference_queue_depth",
                "Requests waiting for a batch row or an adapter slot",
                labels=["model"],
            ),
            "loaded": GaugeMetricFamily(
                "swarm_inference_adapters_loaded", "Adapters in slots", labels=["model"]
            ),
            "steps": CounterMetricFamily(
                "swarm_inference_decode_steps", "Decode steps of the batch", labels=["model"]
            ),
            "mixed": CounterMetricFamily(
                "swarm_inference_mixed_batch_forwards",
                "Forward passes whose rows used different adapters (or adapters and the base)",
                labels=["model"],
            ),
        }
        for ref, stats in self.stats():
            families["running"].add_metric([ref], stats.running)
            families["queued"].add_metric([ref], stats.queued)
            families["loaded"].add_metric([ref], len(stats.adapters_loaded))
            families["steps"].add_metric([ref], stats.steps)
            families["mixed"].add_metric([ref], stats.mixed_forwards)
        yield from families.values()


class InferenceMetrics:
    def __init__(self, stats: StatsSource) -> None:
        self.registry = CollectorRegistry()
        self.messages = nats_metrics_middleware(self.registry, SERVICE)
        self.requests = Counter(
            "swarm_inference_requests",
            "Generation requests by outcome (ok, error, overloaded, cancelled)",
            ["outcome"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "swarm_inference_generated_tokens", "Tokens generated", registry=self.registry
        )
        self.first_token = Histogram(
            "swarm_inference_time_to_first_token_seconds",
            "From admission to the first generated token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(stats))

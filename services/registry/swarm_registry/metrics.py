"""The registry's Prometheus metrics: versions registered, and its NATS requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from swarm_runtime.prometheus import nats_metrics_middleware


class RegistryMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.adapter_versions = Counter(
            "swarm_registry_adapter_versions_registered_total",
            "New adapter versions registered (a repeated registration of a job is not counted)",
            registry=self.registry,
        )
        self.promotions = Counter(
            "swarm_registry_alias_promotions_total",
            "Aliases moved by promotion rules",
            registry=self.registry,
        )
        # Request rates and durations per API subject (swarm.registry.<action>).
        self.messages = nats_metrics_middleware(self.registry, "registry")

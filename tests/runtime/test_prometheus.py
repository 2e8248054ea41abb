"""Metric names across all the services follow Prometheus conventions; subjects are reduced to
templates so that no job id ever becomes a label value."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swarm_contracts.events import Progress
from swarm_runtime.prometheus import subject_template
from swarm_runtime.settings import Settings

# Units Prometheus wants spelled out in base units, never these.
NON_BASE_UNITS = re.compile(r"_(ms|milliseconds|microseconds|minutes|hours|kb|mb|gb|percent)(_|$)")
JOB_ID = re.compile(r"job-[0-9a-f]{8,}")


@pytest.mark.parametrize(
    ("subject", "template"),
    [
        ("swarm.jobs.submit", "swarm.jobs.submit"),
        ("ns.swarm.jobs.job-0123abcd.events.progress", "ns.swarm.jobs.{job}.events.progress"),
        ("swarm.jobs.job-0123abcd.cancel", "swarm.jobs.{job}.cancel"),
        ("swarm.workers.gpu-box-1.heartbeat", "swarm.workers.{worker}.heartbeat"),
        ("swarm.workers.gpu-box-1.assign", "swarm.workers.{worker}.assign"),
        ("swarm.adapters.support-bot.registered", "swarm.adapters.{name}.registered"),
        ("swarm.registry.adapters.alias.set", "swarm.registry.adapters.alias.set"),
        ("swarm.sweeps.submit", "swarm.sweeps.submit"),
        ("swarm.sweeps.sweep-0123abcd.events.created", "swarm.sweeps.{sweep}.events.created"),
        ("swarm.sweeps.sweep-0123abcd.cancel", "swarm.sweeps.{sweep}.cancel"),
        ("_INBOX.Xy12.34", "_INBOX"),
        ("_INBOX.svc.gateway.Xy12.34", "_INBOX"),
        # A worker's own subjects: its id and its jobs' are no label values either.
        (
            "swarm.workers.gpu-box-1.events.job-0123abcd.progress",
            "swarm.workers.{worker}.events.{job}.progress",
        ),
        (
            "swarm.workers.gpu-box-1.registry.store.access",
            "swarm.workers.{worker}.registry.store.access",
        ),
        ("swarm.workers.gpu-box-1.attempt", "swarm.workers.{worker}.attempt"),
        ("swarm.inference.requests.a1b2c3-1.cancel", "swarm.inference.requests.{request}.cancel"),
        ("swarm.inference.workers.gpu-1.heartbeat", "swarm.inference.workers.{worker}.heartbeat"),
        ("swarm.inference.tiny-llama.1.generate", "swarm.inference.tiny-llama.1.generate"),
    ],
)
def test_subject_template(subject: str, template: str) -> None:
    assert subject_template(subject) == template


async def service_registries(settings: Settings) -> dict[str, CollectorRegistry]:
    """Each service's registry, built as its app builds it (nothing connects to NATS)."""
    from swarm_gateway import create_app
    from swarm_inference.app import build_app as build_inference
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_sweeps.app import build_app as build_sweeps
    from swarm_telemetry.prometheus_metrics import PrometheusMetrics
    from swarm_telemetry.series import SeriesStore
    from swarm_trainer.app import build_app as build_trainer

    gateway = create_app(settings)
    # Two requests, so the request counters have labelled samples to check.
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway), base_url="http://g"
    ) as c:
        for _ in range(2):
            assert (await c.get("/metrics")).status_code == 200
    telemetry = PrometheusMetrics(SeriesStore())
    telemetry.record(
        Progress(
            job_id="job-0123456789abcdef", step=1, max_steps=2, loss=1.0, lr=0.1, tokens_per_s=9
        )
    )
    return {
        "gateway": gateway.state.metrics.registry,
        "telemetry": telemetry.registry,
        **{
            name: app.context.get("metrics_server").registry
            for name, app in (
                ("scheduler", build_scheduler(settings)),
                ("registry", build_registry(settings)),
                ("trainer", build_trainer(settings)),
                ("sweeps", build_sweeps(settings)),
                ("inference", build_inference(settings)),
            )
        },
    }


async def test_metric_names_follow_prometheus_conventions(settings: Settings) -> None:
    registries = await service_registries(settings)
    problems: list[str] = []
    seen: dict[str, str] = {}
    for service, registry in registries.items():
        families = list(text_string_to_metric_families(generate_latest(registry).decode()))
        assert families, f"{service} exposes nothing"
        for family in families:
            name = family.name
            if not name.startswith("swarm_") or name.startswith("swarm_swarm"):
                problems.append(f"{service}: {name} lacks the one swarm_ prefix")
            if NON_BASE_UNITS.search(name):
                problems.append(f"{service}: {name} is not in base units")
            if family.type == "counter":
                bad = [
                    s.name for s in family.samples if not s.name.endswith(("_total", "_created"))
                ]
                problems += [f"{service}: counter sample {b} lacks _total" for b in bad]
            elif name.endswith("_total"):
                problems.append(f"{service}: {name} is a {family.type} named like a counter")
            for s in family.samples:
                if "job_id" in s.labels:
                    problems.append(f"{service}: {s.name} has a job_id label")
                problems += [
                    f"{service}: {s.name} label {k}={v} holds a job id"
                    for k, v in s.labels.items()
                    if JOB_ID.search(v)
                ]
            # One name, one service: two services never export the same family.
            if seen.setdefault(name, service) != service:
                problems.append(f"{name} is exported by {seen[name]} and {service}")
    assert not problems, "\n".join(problems)
    names = {
        f.name
        for r in registries.values()
        for f in text_string_to_metric_families(generate_latest(r).decode())
    }
    # The metrics docs/observability.md promises.
    assert {
        "swarm_scheduler_queue_depth",
        "swarm_scheduler_placement_latency_seconds",
        "swarm_scheduler_workers",
        "swarm_scheduler_received_processed_messages_duration_seconds",
        "swarm_registry_adapter_versions_registered",
        "swarm_trainer_step_duration_seconds",
        "swarm_trainer_tokens_per_second",
        "swarm_trainer_cpu_utilization_ratio",
        "swarm_trainer_memory_used_bytes",
        "swarm_gateway_requests",
        "swarm_telemetry_events",
    } <= names


def test_the_otlp_bridge_exports_what_metrics_serves() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import Counter, Gauge, Histogram

    from swarm_runtime.prometheus import OtlpBridge

    registry = CollectorRegistry()
    placed = Counter("swarm_test_placements_total", "placements", ["priority"], registry=registry)
    depth = Gauge("swarm_test_queue_depth", "queued jobs", registry=registry)
    latency = Histogram("swarm_test_latency_seconds", "latency", registry=registry)
    reader = InMemoryMetricReader()
    bridge = OtlpBridge(registry, "test", reader)
    placed.labels(priority="5").inc(3)
    depth.set(7)
    latency.observe(0.25)
    latency.observe(0.5)

    points = {
        (metric.name, tuple(sorted(point.attributes.items()))): point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }
    assert points == {
        ("swarm_test_placements_total", (("priority", "5"),)): 3.0,
        ("swarm_test_queue_depth", ()): 7.0,
        ("swarm_test_latency_seconds_count", ()): 2.0,
        ("swarm_test_latency_seconds_sum", ()): 0.75,
    }
    # Read at collection time: later changes show up in the next export.
    depth.set(2)
    later = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
    assert {m.name: m.data.data_points[0].value for m in later}["swarm_test_queue_depth"] == 2.0
    bridge.shutdown()


def test_otlp_bridge_only_when_an_exporter_is_configured() -> None:
    from swarm_runtime.prometheus import OtlpBridge, otlp_bridge

    registry = CollectorRegistry()
    assert otlp_bridge(Settings(), registry, "test") is None
    bridge = otlp_bridge(Settings(otel_exporter="console"), registry, "test")
    assert isinstance(bridge, OtlpBridge)
    bridge.shutdown()

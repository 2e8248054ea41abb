"""Request counts and durations for Prometheus, labelled by route template (bounded cardinality)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The parts a Tinker call's time is split into (docs/tinker.md, "Per-call timing"), in the order
# the dashboard shows them: each settled call is observed once in each.
TINKER_PARTS = ("total", "compute", "queue")


class GatewayMetrics:
    def __init__(self) -> None:
        # A registry per app, so that several apps in one process (tests) do not collide.
        self.registry = CollectorRegistry()
        # Counters count from here: what the dashboard's totals are "since".
        self.started = datetime.now(UTC)
        self.requests = Counter(
            "swarm_gateway_requests_total",
            "HTTP requests handled",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "swarm_gateway_request_duration_seconds",
            "HTTP request duration until the response started",
            ["method", "route"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "swarm_gateway_requests_in_flight",
            "HTTP requests (including open event streams) in progress",
            registry=self.registry,
        )
        self.submissions = Counter(
            "swarm_gateway_job_submissions_total",
            "Jobs published to the submit stream",
            registry=self.registry,
        )
        # The Tinker API's calls (docs/tinker.md): how long from sent to settled, and of that how
        # long the worker computed (the rest: waiting behind the session's earlier calls, and
        # the trip); sampling's compute is its generation. By tenant (as many as the key table
        # has), so that a tenant's dashboard shows its own calls and no one else's.
        self.tinker_call = Histogram(
            "swarm_gateway_tinker_call_seconds",
            "Tinker API calls from sent to settled, by op and part (total, compute, queue)",
            ["op", "part", "tenant"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.tinker_calls = Counter(
            "swarm_gateway_tinker_calls_total",
            "Tinker API calls settled, by op and state (done, failed)",
            ["op", "state", "tenant"],
            registry=self.registry,
        )

    def tinker_settled(
        self, op: str, state: str, tenant: str, total_s: float, compute_s: float | None
    ) -> None:
        self.tinker_calls.labels(op=op, state=state, tenant=tenant).inc()
        if state != "done":
            return
        total, compute, queue = TINKER_PARTS
        self.tinker_call.labels(op=op, part=total, tenant=tenant).observe(total_s)
        if compute_s is not None:
            self.tinker_call.labels(op=op, part=compute, tenant=tenant).observe(compute_s)
            self.tinker_call.labels(op=op, part=queue, tenant=tenant).observe(
                max(0.0, total_s - compute_s)
            )


class MetricsMiddleware:
    """Pure ASGI so that long-lived SSE responses stream untouched."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_code = 500
        observed = False

        def route() -> str:
            r = scope.get("route")
            return getattr(r, "path", None) or "unmatched"

        async def wrapped_send(message: Message) -> None:
            nonlocal status_code, observed
            if message["type"] == "http.response.start":
                status_code = message["status"]
                observed = True
                self.metrics.duration.labels(scope["method"], route()).observe(
                    time.perf_counter() - start
                )
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, wrapped_send)
        finally:
            self.metrics.in_flight.dec()
            if not observed:
                self.metrics.duration.labels(scope["method"], route()).observe(
                    time.perf_counter() - start
                )
            self.metrics.requests.labels(scope["method"], route(), str(status_code)).inc()

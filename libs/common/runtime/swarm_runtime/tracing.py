"""OpenTelemetry tracing for every service: one trace per job, carried as a W3C ``traceparent``.

A job outlives any one message (it waits in the queue, is requeued, runs for minutes), so its
trace context is not only passed in NATS headers but also stored: ``JobRecord.trace_parent``
(set by the scheduler when it accepts the submission) and ``Assignment.trace_parent`` (the
placement span), from which later spans are started as children.

Each app gets a ``TracerProvider`` of its own rather than the process-global one, so that
several services in one process (tests, ``swarm up`` never does this) keep their own
``service.name`` and can be shut down with their app.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from swarm_runtime.settings import Settings

TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()


def span_exporter_for(settings: Settings) -> SpanExporter | None:
    if settings.otel_exporter == "console":
        return ConsoleSpanExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.otlp_url("traces"))
    return None


def setup_tracing(settings: Settings, service: str) -> TracerProvider:
    """A provider for ``service``, exporting as ``SWARM_OTEL_EXPORTER`` says.

    With the exporter ``none`` spans are still made (cheap, and the trace ids still flow into
    records and headers, so a later hop that does export keeps the job's trace whole); a test
    can add its own span processor to the returned provider.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": f"swarm-{service}"}))
    exporter = span_exporter_for(settings)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_of(provider: TracerProvider | None, service: str) -> Tracer:
    """The service's tracer; a no-op one when tracing is not set up (unit tests)."""
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(f"swarm_{service}")


def traceparent(span: Span | None = None) -> str | None:
    """The W3C ``traceparent`` of ``span`` (default: the current span); None without one."""
    span = span if span is not None else trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def context_from(parent: str | None) -> Context | None:
    """A context whose current span is the remote ``parent``; None (a new trace) if absent
    or malformed."""
    if not parent:
        return None
    context = _PROPAGATOR.extract({TRACEPARENT: parent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def context_from_headers(headers: dict[str, str] | None) -> Context | None:
    return context_from((headers or {}).get(TRACEPARENT))


def trace_headers(span: Span | None = None) -> dict[str, str]:
    """NATS headers carrying ``span``'s (default: the current span's) trace context."""
    parent = traceparent(span)
    return {TRACEPARENT: parent} if parent else {}


@contextmanager
def child_span(
    tracer: Tracer, name: str, parent: str | None, **attributes: str | int | float | bool
) -> Iterator[Span]:
    """A span continuing the stored trace ``parent`` (or a new trace when there is none)."""
    with tracer.start_as_current_span(
        name, context=context_from(parent), attributes=attributes
    ) as span:
        yield span

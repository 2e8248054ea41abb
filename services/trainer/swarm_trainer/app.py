"""The trainer agent's FastStream app: the messages it consumes, typed by their contract."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream
from faststream.nats import JStream, PullSub

from swarm_common.broker import make_broker
from swarm_common.envelope import CloudEvent
from swarm_common.events import CancelRequest
from swarm_common.prometheus import MetricsServer
from swarm_common.registry import ExportAdapter, ExportResult, Reply
from swarm_common.settings import Settings
from swarm_common.tracing import setup_tracing, tracer_of
from swarm_common.workers import Assignment
from swarm_trainer.agent import SERVICE, TrainerAgent, readable
from swarm_trainer.export import export_registered
from swarm_trainer.metrics import TrainerMetrics


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, SERVICE)
    agent = TrainerAgent(settings, broker)
    subjects = agent.subjects
    # Observability: the job's trace (swarm_trainer.job_trace) and Prometheus /metrics.
    tracing = setup_tracing(settings, SERVICE)
    agent.tracer = tracer_of(tracing, SERVICE)
    agent.metrics = metrics = TrainerMetrics(lambda: len(agent.active))
    broker.add_middleware(metrics.messages)
    metrics_server = MetricsServer(settings, metrics.registry, SERVICE)

    async def start_metrics() -> None:
        metrics_server.start()

    async def stop_observability() -> None:
        metrics_server.stop()
        tracing.shutdown()  # flushes the spans of the attempts just ended

    @broker.subscriber(
        subjects.assign(agent.worker_id),
        stream=JStream(subjects.assign_stream, declare=False),
        durable=f"trainer-{agent.worker_id}",
        pull_sub=PullSub(batch_size=1, timeout=5.0),
    )
    async def on_assignment(event: CloudEvent[Assignment]) -> None:
        # Returns as soon as the job is started: the ack must not wait for training.
        await agent.accept(event.data)

    @broker.subscriber(subjects.cancel())
    async def on_cancel(event: CloudEvent[CancelRequest]) -> None:
        await agent.cancel(event.data)

    # Any agent can merge: a queue group spreads export requests over them.
    @broker.subscriber(subjects.trainer("export"), queue="trainer-export")
    async def on_export(request: ExportAdapter) -> Reply[ExportResult]:
        try:
            result = await export_registered(broker, subjects, agent.store, request)
        except Exception as exc:  # the caller gets the reason rather than a timeout
            logging.getLogger("swarm.trainer").exception("export of %s failed", request)
            return Reply[ExportResult](ok=False, error=readable(exc))
        return Reply[ExportResult](ok=True, result=result)

    app = FastStream(
        broker,
        on_startup=[agent.prepare],
        after_startup=[agent.start, start_metrics],
        on_shutdown=[agent.stop],
        after_shutdown=[stop_observability],
    )
    app.context.set_global("tracer_provider", tracing)  # tests add their span exporter to it
    app.context.set_global("metrics_server", metrics_server)
    app.agent = agent  # type: ignore[attr-defined]  # for tests and introspection
    return app


def main() -> None:
    settings = Settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build_app(settings).run())

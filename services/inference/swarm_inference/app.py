"""The inference worker's FastStream app."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from swarm_inference.settings import InferenceSettings
from swarm_inference.worker import SERVICE, InferenceWorker
from swarm_runtime.broker import make_broker
from swarm_runtime.prometheus import MetricsServer
from swarm_runtime.settings import Settings


def build_app(settings: Settings) -> FastStream:
    """The inference worker's app; ``settings`` may be the shared ones (its own read from the
    environment) or ``InferenceSettings``."""
    settings = InferenceSettings.of(settings)
    broker = make_broker(settings, SERVICE)
    worker = InferenceWorker(settings, broker)
    broker.add_middleware(worker.metrics.messages)
    metrics_server = MetricsServer(settings, worker.metrics.registry, SERVICE)

    async def start_metrics() -> None:
        metrics_server.start()

    async def stop_metrics() -> None:
        metrics_server.stop()

    app = FastStream(
        broker,
        after_startup=[worker.start, start_metrics],
        on_shutdown=[worker.stop],
        after_shutdown=[stop_metrics],
    )
    app.worker = worker  # type: ignore[attr-defined]  # for tests and introspection
    app.context.set_global("metrics_server", metrics_server)
    # Subscriptions made at run time, declared for tools/asyncapi.py only.
    app.context.set_global("documented", [worker.document])
    return app


def main() -> None:
    settings = InferenceSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build_app(settings).run())

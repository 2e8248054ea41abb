"""The trainer agent's FastStream app: the messages it consumes, typed by their contract."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from faststream import FastStream
from faststream.nats import JStream, PullSub

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import CancelRequest
from swarm_contracts.providers import read_credentials
from swarm_contracts.registry import EXPORT_ADAPTER, ExportAdapter, ExportResult
from swarm_contracts.replies import Reply
from swarm_contracts.sessions import SessionCall, SessionResult
from swarm_contracts.workers import (
    Assignment,
    BenchmarkRequest,
    ReleaseRequest,
    WorkerBenchmark,
)
from swarm_runtime.broker import inbox_prefix, make_broker
from swarm_runtime.prometheus import MetricsServer
from swarm_runtime.rpc import ServiceClient, answer
from swarm_runtime.settings import Settings, absolute
from swarm_runtime.store import ObjectStore
from swarm_runtime.tracing import setup_tracing, tracer_of
from swarm_trainer.agent import SERVICE, TrainerAgent
from swarm_trainer.metrics import TrainerMetrics
from swarm_trainer.session_lane import GpuLane
from swarm_trainer.sessions_host import SessionHost
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.signed_store import SignedAccess, SignedStore


def build_app(settings: Settings) -> FastStream:
    """The trainer agent's app; ``settings`` may be the shared ones (its own read from the
    environment) or ``TrainerSettings``."""
    settings = TrainerSettings.of(settings)
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
        # FastStream passes its own default ("_INBOX.") to a pull subscription, not the
        # connection's: a provider may subscribe under its own inbox prefix only.
        inbox_prefix=f"{inbox_prefix(settings, SERVICE)}.".encode(),
    )
    async def on_assignment(event: CloudEvent[Assignment]) -> None:
        # Returns as soon as the job is started: the ack must not wait for training.
        await agent.accept(event.data)

    async def on_cancel(event: CloudEvent[CancelRequest]) -> None:
        await agent.cancel(event.data)

    # The scheduler passes each cancellation on to the worker holding the job (core NATS).
    broker.subscriber(subjects.worker_cancel(agent.worker_id), no_reply=True)(on_cancel)
    if agent.provider is None:
        # The cluster's own trainers also hear every cancel as the client sent it, a moment
        # sooner (a provider may not: job ids of other tenants' jobs are none of its business).
        # no_reply: a cancellation is a JetStream publish, whose reply subject waits for the
        # stream's ack; an (empty) answer from here would race it and break the publisher.
        broker.subscriber(subjects.cancel(), no_reply=True)(on_cancel)

    # The scheduler drains this worker (with move_jobs): core NATS, repeated while jobs remain.
    @broker.subscriber(subjects.release(agent.worker_id), no_reply=True)
    async def on_release(event: CloudEvent[ReleaseRequest]) -> None:
        await agent.release(event.data)

    # `swarm workers benchmark ID`: measure again (request/reply, from the gateway).
    @broker.subscriber(subjects.benchmark(agent.worker_id))
    async def on_benchmark(request: BenchmarkRequest) -> Reply[WorkerBenchmark]:
        return await answer(Reply[WorkerBenchmark], agent.benchmark_requested(request))

    # Tinker training sessions held here (swarm_trainer.sessions_host): the gateway's calls, on
    # this worker's own subject, one at a time (their order is the session's). A worker
    # without store keys uses what the registry grants each session's attempt; whether
    # providers' workers get sessions at all is the scheduler's setting (docs/tinker.md).
    def signed(session: str, attempt: int, token: str) -> ObjectStore:
        access = SignedAccess.of_attempt(settings, session, attempt, token, agent.worker_id)
        return SignedStore(access)

    sessions = SessionHost(
        agent.store,
        agent.cache,
        settings.session_idle_s,
        holds=agent.holds_session,
        signed=signed,
        lane=GpuLane(),
    )
    agent.sessions = sessions.listed

    @broker.subscriber(subjects.worker_session(agent.worker_id))
    async def on_session_call(call: SessionCall) -> Reply[SessionResult]:
        return await answer(Reply[SessionResult], sessions.call(call))

    store = agent.store
    if agent.provider is None and store is not None:
        # Any of the cluster's agents can merge (it writes the store): a queue group spreads
        # export requests over them. A provider's agent is not asked, nor one without store
        # keys (an export is no job's: nothing grants its keys).

        async def on_export(request: ExportAdapter) -> Reply[ExportResult]:
            # Imported here: peft and transformers are seconds of start-up the agent's first
            # heartbeat must not wait for (TrainerAgent.prepare).
            from swarm_trainer.export import export_registered

            registry = ServiceClient(broker.connection, "registry", subjects.registry, timeout=10.0)
            return await answer(Reply[ExportResult], export_registered(registry, store, request))

        broker.subscriber(subjects.trainer(EXPORT_ADAPTER.name), queue="trainer-export")(on_export)

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
    app.sessions = sessions  # type: ignore[attr-defined]
    return app


def join_settings(
    settings: TrainerSettings, creds: Path, nats_url: str | None = None
) -> TrainerSettings:
    """A provider's agent: its join file's identity and NATS URL (``nats_url`` overrides it),
    and, unless store keys or ``SWARM_STORE_ACCESS`` are given, no store keys at all: the
    registry grants its jobs' keys one by one (docs/providers.md, *Store access*)."""
    # Absolute: the agent's Ray processes open it too, from another working directory.
    creds = absolute(creds)
    credentials = read_credentials(creds)
    url = nats_url or credentials.nats_url or settings.nats_url
    update: dict[str, object] = {"provider_creds_file": creds, "nats_url": url}
    if "store_access" not in settings.model_fields_set and not settings.s3_access_key:
        update["store_access"] = "signed"
    return settings.model_copy(update=update)


def main(argv: list[str] | None = None) -> None:
    """``swarm-trainer``: the agent, configured from the environment (``SWARM_*``), or
    ``swarm-trainer join --creds FILE [--nats URL]``: a provider's agent (docs/providers.md)."""
    parser = argparse.ArgumentParser(prog="swarm-trainer", description=main.__doc__)
    commands = parser.add_subparsers(dest="command")
    join = commands.add_parser("join", help="join a Swarm as a provider")
    join.add_argument(
        "--creds", type=Path, required=True, help="the file `swarm providers add` wrote"
    )
    join.add_argument("--nats", help="the Swarm's NATS URL (default: the one in the file)")
    args = parser.parse_args(argv)
    settings = TrainerSettings()
    if args.command == "join":
        settings = join_settings(settings, args.creds, args.nats)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build_app(settings).run())

"""The scheduler's FastStream app: which messages it consumes, typed by their contract."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from nats.js.api import AckPolicy, ConsumerConfig
from pydantic import Field

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import AnyJobEvent, CancelRequest, PauseRequest, ResumeRequest
from swarm_contracts.jobs import JobSubmission
from swarm_contracts.providers import ATTEMPT_TOKEN_HEADER
from swarm_contracts.replies import Reply
from swarm_contracts.sessions import (
    PLACE_SESSION,
    RELEASE_SESSION,
    PlaceSession,
    ReleaseSession,
    SessionLease,
)
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import VerifyRequest
from swarm_contracts.workers import AttemptQuery, AttemptStatus, Heartbeat
from swarm_runtime.broker import make_broker
from swarm_runtime.intake import Handler, Intake, IntakeMetrics, RawMsg, RetryLater
from swarm_runtime.prometheus import MetricsServer
from swarm_runtime.rpc import answer, route
from swarm_runtime.settings import Settings
from swarm_runtime.tracing import context_from_headers, setup_tracing, tracer_of
from swarm_scheduler.metrics import SchedulerMetrics
from swarm_scheduler.scheduler import Scheduler
from swarm_scheduler.settings import SchedulerSettings

log = logging.getLogger("swarm.scheduler")
JobEventEnvelope = CloudEvent[Annotated[AnyJobEvent, Field(discriminator="event")]]


def _work_queue(stream: str, name: str) -> dict[str, Any]:
    """A durable pull consumer ``scheduler-<name>`` shared by the scheduler processes (only
    the leader pulls)."""
    durable = f"scheduler-{name}"
    # Explicit acks, and a message that keeps failing is given up after a while rather than
    # retried for ever; malformed ones never reach a handler (dead-lettered by the intake).
    # A short ack_wait: what a killed leader held comes back to the next one within seconds
    # (the intake keeps a message it still handles from redelivery).
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=10,
        max_deliver=50,
        max_ack_pending=4096,
    )
    return {"stream": stream, "durable": durable, "config": config}


class Handlers:
    """The scheduler's message handlers, typed by their contract (FastStream handlers that the
    intakes call)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _follower_gives_back(self) -> None:
        self.scheduler.lead.check()

    async def on_submit(self, event: CloudEvent[JobSubmission], msg: RawMsg) -> None:
        self._follower_gives_back()
        key = (msg.headers or {}).get("Nats-Msg-Id") or event.id
        # A child of the submitter's span when it sent a traceparent header, else a new trace.
        with self.scheduler.tracer.start_as_current_span(
            "scheduler.submit",
            context=context_from_headers(msg.headers),
            attributes={"swarm.job_id": event.data.job_id or "", "swarm.tenant": event.data.tenant},
        ):
            if await self.scheduler.submit(event.data, key) is None:
                raise RetryLater(2.0)  # the registry is down: try again shortly

    async def on_worker_event(self, event: JobEventEnvelope, msg: RawMsg) -> None:
        """A worker's event, on its own ``swarm.workers.<id>.events.<job>.<event>`` subject."""
        self._follower_gives_back()
        headers = msg.headers or {}
        await self.scheduler.on_job_event(
            event.data,
            headers.get(ATTEMPT_TOKEN_HEADER),
            worker_id=Subjects.worker_of(msg.subject) or "",
            msg_id=headers.get("Nats-Msg-Id"),
        )

    async def on_attempt(self, query: AttemptQuery, message: NatsMessage) -> Reply[AttemptStatus]:
        worker_id = Subjects.worker_of(message.raw_message.subject) or ""
        return await answer(Reply[AttemptStatus], self.scheduler.attempt_status(query, worker_id))

    async def on_place_session(self, request: PlaceSession) -> Reply[SessionLease]:
        return await answer(Reply[SessionLease], self.scheduler.place_session(request))

    async def on_release_session(self, request: ReleaseSession) -> Reply[SessionLease]:
        return await answer(Reply[SessionLease], self.scheduler.release_session(request))

    async def on_cancel(self, event: CloudEvent[CancelRequest], msg: RawMsg) -> None:
        self._follower_gives_back()
        job_id = msg.subject.split(".")[-2]
        await self.scheduler.cancel(
            job_id if job_id != "*" else event.data.job_id, event.data.reason
        )

    async def on_pause(self, event: CloudEvent[PauseRequest], msg: RawMsg) -> None:
        self._follower_gives_back()
        await self.scheduler.pause(_job_of(msg.subject, event.data.job_id), event.data.reason)

    async def on_resume(self, event: CloudEvent[ResumeRequest], msg: RawMsg) -> None:
        self._follower_gives_back()
        await self.scheduler.resume(_job_of(msg.subject, event.data.job_id), event.data.reason)

    async def on_verify(self, event: CloudEvent[VerifyRequest], msg: RawMsg) -> None:
        self._follower_gives_back()
        await self.scheduler.verify(event.data.job_id)

    async def on_heartbeat(self, event: CloudEvent[Heartbeat], msg: RawMsg) -> None:
        await self.scheduler.on_heartbeat(event.data, msg.subject)


def _job_of(subject: str, named: str) -> str:
    """The job a control subject (``swarm.jobs.<job_id>.<command>``) is about: the subject's
    word, which the publisher's permissions vouch for, over the body's."""
    job_id = subject.split(".")[-2]
    return job_id if job_id != "*" else named


class Consumers:
    """The scheduler's intakes: heartbeats in every process, the work streams in the leader
    (``swarm_runtime.leader.Lead`` starts and stops them).

    Submissions, job events and heartbeats are the scheduler's busiest subjects: intakes on
    plain nats-py rather than FastStream subscribers (``swarm_runtime.intake`` says why).
    """

    def __init__(self, broker: NatsBroker, scheduler: Scheduler, metrics: IntakeMetrics) -> None:
        subjects, handlers = scheduler.subjects, Handlers(scheduler)
        self.broker = broker

        def intake(subject: str, handler: Handler, **options: Any) -> Intake:
            return Intake("scheduler", subjects, subject, handler, metrics=metrics, **options)

        self.leader_only = [
            intake(
                subjects.submit, handlers.on_submit, **_work_queue(subjects.submit_stream, "submit")
            ),
            intake(
                subjects.worker_event(),
                handlers.on_worker_event,
                # A job's events reach everyone else in the order its worker sent them.
                ordered_by=Subjects.job_of_worker_event,
                **_work_queue(subjects.worker_events_stream, "worker-events"),
            ),
            intake(
                subjects.cancel(),
                handlers.on_cancel,
                **_work_queue(subjects.control_stream, "cancel"),
            ),
            intake(
                subjects.verify(),
                handlers.on_verify,
                **_work_queue(subjects.control_stream, "verify"),
            ),
            intake(
                subjects.pause(), handlers.on_pause, **_work_queue(subjects.control_stream, "pause")
            ),
            intake(
                subjects.resume(),
                handlers.on_resume,
                **_work_queue(subjects.control_stream, "resume"),
            ),
        ]
        self.heartbeats = intake(subjects.heartbeat(), handlers.on_heartbeat)
        self.lead = scheduler.lead
        self.lead.leader_only(self.leader_only, lambda: broker.connection)

    @property
    def all(self) -> list[Intake]:
        return [*self.leader_only, self.heartbeats]

    async def start(self) -> None:
        # Every scheduler process follows heartbeats (core NATS reaches them all), so that a
        # follower that takes over already knows which workers are alive.
        await self.heartbeats.start(self.broker.connection)
        await self.lead.follow(self.lead.leading)

    async def stop(self) -> None:
        for sub in self.all:
            await sub.stop()


def build_app(settings: Settings) -> FastStream:
    """The scheduler's app; ``settings`` may be the shared ones (its own read from the
    environment) or ``SchedulerSettings``."""
    settings = SchedulerSettings.of(settings)
    broker = make_broker(settings, "scheduler")
    scheduler = Scheduler(settings, broker)
    # Observability: the job's trace (docs/observability.md) and Prometheus /metrics.
    tracing = setup_tracing(settings, "scheduler")
    scheduler.tracer = tracer_of(tracing, "scheduler")
    scheduler.metrics = metrics = SchedulerMetrics()
    metrics.watch(scheduler.view, scheduler.workers, lambda: scheduler.leading)
    broker.add_middleware(metrics.messages)
    metrics_server = MetricsServer(settings, metrics.registry, "scheduler")
    consumers = Consumers(broker, scheduler, metrics.intakes)
    # Whether a worker still holds an attempt: any scheduler process answers from its view.
    handlers = Handlers(scheduler)
    broker.subscriber(scheduler.subjects.worker_attempt(), queue="scheduler")(handlers.on_attempt)
    # The gateway leases room to training sessions (the leader answers; a follower refuses).
    for served in (
        route(PLACE_SESSION, handlers.on_place_session),
        route(RELEASE_SESSION, handlers.on_release_session),
    ):
        subject = scheduler.subjects.scheduler(served.action.name)
        broker.subscriber(subject, queue="scheduler")(served.handler)

    app = FastStream(broker)

    @app.on_startup
    async def prepare() -> None:
        # Streams and buckets must exist before the durable consumers are created.
        await broker.connect()
        await scheduler.prepare()
        metrics_server.start()

    @app.after_startup
    async def start() -> None:
        await consumers.start()
        await scheduler.start()

    @app.on_shutdown
    async def stop() -> None:
        await consumers.stop()
        await scheduler.stop()
        metrics_server.stop()
        tracing.shutdown()

    app.context.set_global("scheduler", scheduler)
    app.context.set_global("tracer_provider", tracing)  # tests add their span exporter to it
    app.context.set_global("metrics_server", metrics_server)
    app.context.set_global("intakes", consumers.all)  # tools/asyncapi.py
    return app

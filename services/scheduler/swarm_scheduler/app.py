"""The scheduler's FastStream app: which messages it consumes, typed by their contract."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from faststream import AckPolicy, FastStream
from faststream.nats import JStream, NatsMessage, PullSub
from nats.js.api import ConsumerConfig
from pydantic import Field

from swarm_common.broker import make_broker
from swarm_common.envelope import CloudEvent
from swarm_common.events import AnyJobEvent, CancelRequest
from swarm_common.jobs import JobSubmission
from swarm_common.prometheus import MetricsServer
from swarm_common.settings import Settings
from swarm_common.subjects import Subjects
from swarm_common.tracing import context_from_headers, setup_tracing, tracer_of
from swarm_common.workers import Heartbeat
from swarm_scheduler.metrics import SchedulerMetrics
from swarm_scheduler.scheduler import Scheduler

log = logging.getLogger("swarm.scheduler")
JobEventEnvelope = CloudEvent[Annotated[AnyJobEvent, Field(discriminator="event")]]
# A follower that still got a message (in the moment before its consumers stopped) gives it
# back for the leader after this long.
FOLLOWER_NACK_DELAY_S = 0.5
OWN_EVENTS = frozenset({"queued", "assigned", "requeued"})


def _durable(stream: str) -> dict:
    # Explicit acks, and a message that keeps failing is given up after a while rather than
    # retried for ever; malformed ones never get here (dead-lettered by the broker middleware).
    return {
        "stream": JStream(stream, declare=False),
        # Large batches: the messages of a batch are handled concurrently.
        "pull_sub": PullSub(batch_size=128, timeout=1.0),
        "ack_policy": AckPolicy.NACK_ON_ERROR,
        "config": ConsumerConfig(ack_wait=30, max_deliver=50, max_ack_pending=4096),
    }


def build_app(settings: Settings) -> FastStream:
    subjects = Subjects(settings.namespace)
    # Two log lines per message would be a thousand a second with 500 workers' heartbeats.
    broker = make_broker(settings, "scheduler", message_log_level=logging.DEBUG)
    scheduler = Scheduler(settings, broker)
    # Observability: the job's trace (docs/observability.md) and Prometheus /metrics.
    tracing = setup_tracing(settings, "scheduler")
    scheduler.tracer = tracer_of(tracing, "scheduler")
    scheduler.metrics = metrics = SchedulerMetrics()
    metrics.watch(scheduler)
    broker.add_middleware(metrics.messages)
    metrics_server = MetricsServer(settings, metrics.registry, "scheduler")

    submit_sub = broker.subscriber(
        subjects.submit, durable="scheduler-submit", **_durable(subjects.submit_stream)
    )
    events_sub = broker.subscriber(
        subjects.job_event(), durable="scheduler-events", **_durable(subjects.events_stream)
    )
    cancel_sub = broker.subscriber(
        subjects.cancel(), durable="scheduler-cancel", **_durable(subjects.control_stream)
    )
    # Only the leader consumes the work streams: the durable pull consumers are shared work
    # queues, so a follower that pulled would take messages away from the leader.
    leader_only: list[Any] = [submit_sub, events_sub, cancel_sub]

    def current_message() -> NatsMessage:
        # Read from the broker's context rather than taken as a `msg: NatsMessage` argument:
        # fast_depends resolves such context arguments in a worker thread, and a thread hop
        # per message was a large part of the cost of a submission or a job event.
        return broker.context.get_local("message")

    async def follower_gives_back(msg: NatsMessage) -> bool:
        if scheduler.leading:
            return False
        await msg.nack(delay=FOLLOWER_NACK_DELAY_S)
        return True

    @submit_sub
    async def on_submit(event: CloudEvent[JobSubmission]) -> None:
        msg = current_message()
        if await follower_gives_back(msg):
            return
        key = (msg.headers or {}).get("Nats-Msg-Id") or event.id
        # A child of the submitter's span when it sent a traceparent header, else a new trace.
        with scheduler.tracer.start_as_current_span(
            "scheduler.submit",
            context=context_from_headers(msg.headers),
            attributes={"swarm.job_id": event.data.job_id or "", "swarm.tenant": event.data.tenant},
        ):
            if await scheduler.submit(event.data, key) is None:
                await msg.nack(delay=2.0)  # the registry is down: try again shortly

    @events_sub
    async def on_job_event(event: JobEventEnvelope) -> None:
        msg = current_message()
        if await follower_gives_back(msg):
            return
        # The scheduler's own events (queued, assigned, requeued) are already in its records.
        if event.data.event not in OWN_EVENTS:
            await scheduler.on_job_event(event.data)

    @cancel_sub
    async def on_cancel(event: CloudEvent[CancelRequest], msg: NatsMessage) -> None:
        if await follower_gives_back(msg):
            return
        job_id = msg.raw_message.subject.split(".")[-2]
        await scheduler.cancel(job_id if job_id != "*" else event.data.job_id, event.data.reason)

    @broker.subscriber(subjects.heartbeat())
    async def on_heartbeat(event: CloudEvent[Heartbeat]) -> None:
        await scheduler.on_heartbeat(event.data)

    async def consume(leading: bool) -> None:
        for sub in leader_only:
            try:
                if leading and not sub.running:
                    await sub.start()
                elif not leading and sub.running:
                    await sub.stop()
            except Exception:
                # The handlers check leadership too, so a consumer left in the wrong state
                # delays messages but never lets a follower act on them.
                log.exception("could not %s a consumer", "start" if leading else "stop")

    scheduler.on_leadership = consume

    app = FastStream(broker)

    @app.on_startup
    async def prepare() -> None:
        # Streams and buckets must exist before the durable consumers are created.
        await broker.connect()
        await scheduler.prepare()
        metrics_server.start()

    @app.after_startup
    async def start() -> None:
        await consume(scheduler.leading)
        await scheduler.start()

    @app.on_shutdown
    async def stop() -> None:
        await scheduler.stop()
        metrics_server.stop()
        tracing.shutdown()

    app.context.set_global("scheduler", scheduler)
    app.context.set_global("tracer_provider", tracing)  # tests add their span exporter to it
    app.context.set_global("metrics_server", metrics_server)
    return app

"""The sweeps service's FastStream app: which messages it consumes, typed by their contract.

Like the scheduler's, its consumers are durable pull consumers shared by every sweeps process
and run only by the leader (``swarm_runtime.intake`` makes them startable and stoppable).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from faststream import FastStream
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import Field

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import TERMINAL_EVENTS, AnyJobEvent, Started, Validated, named
from swarm_contracts.subjects import Subjects
from swarm_contracts.sweeps import SweepCancelRequest, SweepSubmission
from swarm_runtime.broker import make_broker
from swarm_runtime.intake import Handler, Intake, RawMsg
from swarm_runtime.prometheus import MetricsServer
from swarm_runtime.settings import Settings
from swarm_sweeps.controller import Controller
from swarm_sweeps.metrics import SweepsMetrics

log = logging.getLogger("swarm.sweeps")
JobEventEnvelope = CloudEvent[Annotated[AnyJobEvent, Field(discriminator="event")]]
# The job events a sweep acts on; the others (progress, checkpoints, ...) are acked unread.
TRIAL_EVENTS = named(Started, Validated) | TERMINAL_EVENTS


def _work_queue(
    stream: str, name: str, deliver: DeliverPolicy = DeliverPolicy.ALL
) -> dict[str, Any]:
    durable = f"sweeps-{name}"
    config = ConsumerConfig(
        durable_name=durable,
        deliver_policy=deliver,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30,
        max_deliver=100,
        max_ack_pending=1024,
    )
    return {"stream": stream, "durable": durable, "config": config}


class Handlers:
    """What the leader does with each message; a follower gives every message back."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def _leader_only(self) -> None:
        self.controller.lead.check()

    async def on_submit(self, event: CloudEvent[SweepSubmission], msg: RawMsg) -> None:
        """A new sweep (``swarm.sweeps.submit``; ``Nats-Msg-Id``: its idempotency key)."""
        await self._leader_only()
        key = (msg.headers or {}).get("Nats-Msg-Id") or event.id
        await self.controller.submit(event.data, key)

    async def on_cancel(self, event: CloudEvent[SweepCancelRequest], msg: RawMsg) -> None:
        """Cancel a sweep: every trial still in flight is cancelled."""
        await self._leader_only()
        sweep_id = msg.subject.split(".")[-2]
        request = event.data
        if sweep_id != "*" and sweep_id != request.sweep_id:
            request = request.model_copy(update={"sweep_id": sweep_id})
        await self.controller.cancel(request)

    async def on_job_event(self, event: JobEventEnvelope) -> None:
        """A trial's job started, was evaluated or ended."""
        await self._leader_only()
        await self.controller.on_job_event(event.data)

    def not_a_trial_event(self, subject: str) -> bool:
        # <prefix>.swarm.jobs.<job_id>.events.<event>
        _, job_id, _, name = subject.rsplit(".", 3)
        return name not in TRIAL_EVENTS or not self.controller.wants(job_id)


def build_app(settings: Settings) -> FastStream:
    subjects = Subjects(settings.namespace)
    broker = make_broker(settings, "sweeps")
    controller = Controller(settings, broker)
    metrics = SweepsMetrics(controller)
    broker.add_middleware(metrics.messages)
    metrics_server = MetricsServer(settings, metrics.registry, "sweeps")
    handlers = Handlers(controller)

    def intake(subject: str, handler: Handler, **options: Any) -> Intake:
        return Intake("sweeps", subjects, subject, handler, metrics=metrics.intakes, **options)

    intakes = [
        intake(
            subjects.sweep_submit,
            handlers.on_submit,
            **_work_queue(subjects.sweeps_stream, "submit"),
        ),
        intake(
            subjects.sweep_cancel(),
            handlers.on_cancel,
            **_work_queue(subjects.sweeps_stream, "cancel"),
        ),
        intake(
            subjects.job_event(),
            handlers.on_job_event,
            skip=handlers.not_a_trial_event,
            # From the consumer's creation on: trials are submitted only after it exists, and
            # the job events before it were nobody's trials.
            **_work_queue(subjects.events_stream, "job-events", DeliverPolicy.NEW),
        ),
    ]

    controller.lead.leader_only(intakes, lambda: broker.connection)
    app = FastStream(broker)

    @app.on_startup
    async def prepare() -> None:
        await broker.connect()
        await controller.prepare()
        metrics_server.start()

    @app.after_startup
    async def start() -> None:
        await controller.lead.follow(controller.leading)
        await controller.start()

    @app.on_shutdown
    async def stop() -> None:
        for sub in intakes:
            await sub.stop()
        await controller.stop()
        metrics_server.stop()

    app.context.set_global("controller", controller)
    app.context.set_global("metrics_server", metrics_server)
    app.context.set_global("intakes", intakes)  # tools/asyncapi.py
    return app

"""Typed handlers on plain nats-py subscriptions, for a service's busiest subjects.

FastStream's per-message machinery (middlewares, context, dependency resolution, a task per
message) costs about 150-200 µs of CPU a message on the development machine, against about
15 µs for nats-py plus pydantic. On the scheduler's heartbeats, submissions and job events
that was most of its CPU (docs/performance.md), so it takes them through an ``Intake``, which
keeps FastStream's conventions:

* the handler is a FastStream handler: its first parameter's annotation is the message's
  contract, parsed with ``model_validate_json``; a second parameter, if any, gets the raw
  ``nats.aio.msg.Msg`` (headers, subject), annotated ``RawMsg`` (FastStream's context
  ``message.raw_message``), so that the very same function can be a FastStream subscriber
  (``document``, or a service that goes back to FastStream);
* malformed input is dead-lettered (``swarm_runtime.broker.dead_letter``) and acked;
* on JetStream, a handler that returns has its message acked, one that raises ``RetryLater``
  has it redelivered after the delay, one that fails has it redelivered at once (up to the
  consumer's ``max_deliver``);
* ``ordered_by`` (a key of the subject, e.g. the job id): messages of one key are handled one
  after another in the stream's order, and one that fails is tried again in place, the later
  ones of its key waiting, rather than redelivered behind them (a redelivery comes after
  the messages already fetched: a job's events would be relayed out of order). An ordered
  intake that takes over a consumer whose previous holder died with messages unsettled (a
  new leader) waits for them to come back (``ack_wait``) before it fetches: the server
  redelivers them ahead of newer ones, which would otherwise be handled first;
* on JetStream, a message held longer than a third of the consumer's ``ack_wait`` (waiting in
  its key's lane, or a slow handler) is kept from redelivery (``in_progress``), so that a
  short ``ack_wait`` (a quick takeover) costs no duplicates;
* every message is counted in the families FastStream's Prometheus middleware uses
  (``swarm_<service>_received_messages_total`` …), labelled by subject template;
* ``document(broker)`` declares its handler as a FastStream subscriber (never started), for
  the AsyncAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, get_type_hints

from faststream import Context
from faststream.nats import JStream, NatsBroker, PullSub
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    stop_after_delay,
    wait_exponential,
)

from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import dead_letter
from swarm_runtime.prometheus import subject_template
from swarm_runtime.records import Conflict
from swarm_runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[None]]
# A handler's second parameter: the raw nats-py message, from an intake or from FastStream.
RawMsg = Annotated[Msg, Context("message.raw_message")]
# Messages of one pull consumer handled at once: enough to keep a service busy while its
# handlers wait on NATS round trips, few enough to bound memory and the redelivery burst.
MAX_IN_FLIGHT = 512
# An idle pull consumer checks that it still exists this often (a nats-server restarted
# without its store forgets it, and pulls would then wait for ever).
IDLE_CHECK_S = 10.0
# A message whose record was contended past its retries comes back after this long.
CONTENDED_RETRY_S = 0.2
# An ordered intake's failing message is tried again in place for this long (a NATS restart
# takes seconds), then given up to redelivery: order is lost only past a long outage.
ORDERED_RETRY_S = 60.0


class RetryLater(Exception):
    """Raised by a JetStream handler: redeliver the message after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"retry in {delay}s")
        self.delay = delay

    def __reduce__(self) -> tuple[Any, ...]:
        # Like every exception here, it must pickle (it may cross a process boundary).
        return type(self), (self.delay,), self.__dict__


# FastStream's buckets for message sizes (2^4 .. 2^24 bytes).
SIZE_BUCKETS = (*(2.0**n for n in range(4, 25, 2)), float("inf"))
_LABELS = ("app_name", "broker", "handler")


class IntakeMetrics:
    """The received-message families of FastStream's Prometheus middleware for ``service``
    (same names, labels and buckets), fed by intakes, so that a dashboard sees one set of
    numbers whichever way a subject is consumed.

    Make it before the service's ``PrometheusMiddleware`` on the same registry: the middleware
    then counts into these families rather than registering its own.
    """

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        prefix = f"swarm_{service}"
        self.received = Counter(
            f"{prefix}_received_messages_total",
            "Count of received messages by broker and handler",
            _LABELS,
            registry=registry,
        )
        self.size = Histogram(
            f"{prefix}_received_messages_size_bytes",
            "Histogram of received messages size in bytes by broker and handler",
            _LABELS,
            registry=registry,
            buckets=SIZE_BUCKETS,
        )
        self.processed_total = Counter(
            f"{prefix}_received_processed_messages_total",
            "Count of received processed messages by broker, handler and status",
            (*_LABELS, "status"),
            registry=registry,
        )
        self.duration = Histogram(
            f"{prefix}_received_processed_messages_duration_seconds",
            "Histogram of received processed messages duration in seconds by broker and handler",
            _LABELS,
            registry=registry,
        )
        self.exceptions = Counter(
            f"{prefix}_received_processed_messages_exceptions_total",
            "Count of received processed messages exceptions by broker, handler and exception_type",
            (*_LABELS, "exception_type"),
            registry=registry,
        )
        self.service = service
        self._children: dict[object, tuple[Any, ...]] = {}

    def of(self, handler: str) -> tuple[Any, ...]:
        # prometheus_client's labels() lookup costs more than the increment: cache the children.
        found = self._children.get(handler)
        if found is None:
            labels = (self.service, "nats", handler)
            found = self._children[handler] = (
                self.received.labels(*labels),
                self.size.labels(*labels),
                self.duration.labels(*labels),
            )
        return found

    def processed(self, handler: str, status: str) -> None:
        child = self._children.get((handler, status))
        if child is None:
            child = self._children[(handler, status)] = (
                self.processed_total.labels(self.service, "nats", handler, status),
            )
        child[0].inc()

    def exception(self, handler: str, exc: Exception) -> None:
        self.exceptions.labels(self.service, "nats", handler, type(exc).__name__).inc()


class Intake:
    """One subscription: core NATS, or a durable pull consumer on ``stream``."""

    def __init__(
        self,
        service: str,
        subjects: Subjects,
        subject: str,
        handler: Handler,
        *,
        stream: str | None = None,
        durable: str | None = None,
        config: ConsumerConfig | None = None,
        batch: int = 128,
        skip: Callable[[str], bool] | None = None,
        ordered_by: Callable[[str], str] | None = None,
        metrics: IntakeMetrics | None = None,
    ) -> None:
        """``skip``: subjects acked without being parsed or handled (cheaper than a filter
        the server could only express as several consumers); ``ordered_by``: the key of a
        subject whose messages must be handled in order (the module's docstring)."""
        params = list(inspect.signature(handler).parameters)
        self.model: type[BaseModel] = get_type_hints(handler)[params[0]]
        self._with_msg = len(params) > 1
        self.service, self.subjects, self.subject = service, subjects, subject
        self.handler = handler
        self.stream, self.durable, self.config, self.batch = stream, durable, config, batch
        self.skip, self.ordered_by, self.metrics = skip, ordered_by, metrics
        # Per key of an ordered intake: the task handling its latest message.
        self._lanes: dict[str, asyncio.Task[None]] = {}
        self._connection: Client | None = None
        self._sub: Subscription | JetStreamContext.PullSubscription | None = None
        self._puller: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        # The messages being handled (or waiting in their lane), and since when, by id().
        self._held: dict[int, tuple[Msg, float]] = {}
        self._keeper: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._sub is not None

    async def start(self, connection: Client) -> None:
        self._connection = connection
        if self.stream is None:
            self._sub = await connection.subscribe(self.subject, cb=self.handle)
            return
        self._sub = await self._pull_subscription()
        self._puller = asyncio.create_task(self._pull_loop())
        self._keeper = asyncio.create_task(self._keep_held())

    async def stop(self) -> None:
        """Stop taking messages; the ones being handled finish (or time out and are redelivered)."""
        sub, self._sub = self._sub, None
        if self._puller is not None:
            await cancel_and_wait([self._puller])
            self._puller = None
        if self._keeper is not None:
            await cancel_and_wait([self._keeper])
            self._keeper = None
        if self._in_flight:
            await asyncio.wait(self._in_flight, timeout=10)
        if sub is not None:
            with contextlib.suppress(Exception):  # the connection may be gone already
                await sub.unsubscribe()

    async def _pull_subscription(self) -> JetStreamContext.PullSubscription:
        assert self._connection is not None
        assert self.durable is not None
        return await self._connection.jetstream().pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=self.config
        )

    @property
    def _ack_wait(self) -> float:
        return float(self.config.ack_wait or 30.0) if self.config is not None else 30.0

    async def _after_previous_holder(self, sub: JetStreamContext.PullSubscription) -> None:
        """An ordered intake taking over the consumer: the messages its previous holder fetched
        and never settled (it died) come back after ``ack_wait``, then ahead of newer ones."""
        try:
            info = await sub.consumer_info()
        except Exception as exc:  # cannot tell: go on (order is kept once they come back)
            log.warning("could not read consumer %s: %r", self.durable, exc)
            return
        pending = info.num_ack_pending or 0
        if pending:
            # The server's ack_wait (a consumer made by an older release may differ from ours).
            wait = float(info.config.ack_wait or self._ack_wait) + 2.0
            log.warning(
                "consumer %s: %d messages unsettled by its previous holder; fetching in %.0f s, "
                "once they are redelivered first",
                self.durable,
                pending,
                wait,
            )
            await asyncio.sleep(wait)

    async def _keep_held(self) -> None:
        """Tell the server the messages held a while are still being handled."""
        every = self._ack_wait / 3
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for msg, since in list(self._held.values()):
                if now - since > every:
                    with contextlib.suppress(Exception):  # disconnected: redelivered, then
                        await msg.in_progress()

    async def _pull_loop(self) -> None:
        idle_since, failures = time.monotonic(), 0
        if self.ordered_by is not None and isinstance(self._sub, JetStreamContext.PullSubscription):
            await self._after_previous_holder(self._sub)
        while True:
            sub = self._sub
            if sub is None:  # stopped: nats-py can turn our cancellation into a fetch timeout
                return
            assert isinstance(sub, JetStreamContext.PullSubscription)
            try:
                while len(self._in_flight) >= MAX_IN_FLIGHT:
                    await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
                msgs = await sub.fetch(min(self.batch, MAX_IN_FLIGHT - len(self._in_flight)), 1.0)
            except TimeoutError:
                # nats-py's own, or a bare one when the server's answer to its first probe
                # took most of the second (a busy machine): no messages either way.
                if time.monotonic() - idle_since > IDLE_CHECK_S:
                    idle_since = time.monotonic()
                    await self._recreate_if_gone(sub)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Disconnected, or the server is restarting: nats-py reconnects by itself.
                log.warning("pulling %s failed (%r); trying again", self.subject, exc)
                await asyncio.sleep(1.0)
                failures += 1
                # After a few failures in a row, subscribe again even if the consumer is there.
                await self._recreate_if_gone(sub, anyway=failures >= 3)
                continue
            idle_since, failures = time.monotonic(), 0
            now = time.monotonic()
            for msg in msgs:
                self._held[id(msg)] = (msg, now)
                task = self._dispatch(msg)
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                task.add_done_callback(functools.partial(self._unhold, id(msg)))

    def _unhold(self, key: int, _: asyncio.Task[None]) -> None:
        self._held.pop(key, None)

    def _dispatch(self, msg: Msg) -> asyncio.Task[None]:
        """A task handling ``msg``: at once, or in an ordered intake after the task of the
        previous message of its key."""
        if self.ordered_by is None:
            return asyncio.create_task(self.handle(msg))
        key = self.ordered_by(msg.subject)
        task = asyncio.create_task(self._handle_after(self._lanes.get(key), msg))
        self._lanes[key] = task

        def done(t: asyncio.Task[None], key: str = key) -> None:
            if self._lanes.get(key) is t:
                del self._lanes[key]

        task.add_done_callback(done)
        return task

    async def _handle_after(self, previous: asyncio.Task[None] | None, msg: Msg) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # its outcome is its own: only its end matters here
        await self.handle(msg)

    async def _recreate_if_gone(
        self, sub: JetStreamContext.PullSubscription, *, anyway: bool = False
    ) -> None:
        """Make the durable consumer again if the server lost it (``anyway``: subscribe again
        in any case); never raises, so that the pull loop outlives a disconnection."""
        if not anyway:
            try:
                await sub.consumer_info()
                return
            except NotFoundError:
                log.warning("consumer %s is gone; creating it again", self.durable)
            except Exception as exc:
                log.warning("could not check consumer %s: %r", self.durable, exc)
                return
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if self._sub is None:  # stopped meanwhile: a new subscription would outlive stop()
            return
        try:
            self._sub = await self._pull_subscription()
        except Exception as exc:
            log.warning("could not create consumer %s again: %r", self.durable, exc)

    async def handle(self, msg: Msg) -> None:
        subject = msg.subject
        if self.skip is not None and self.skip(subject):
            if self.stream is not None:
                await msg.ack()
            return
        handler = subject_template(subject)
        counted = self.metrics.of(handler) if self.metrics is not None else None
        if counted is not None:
            counted[0].inc()
            counted[1].observe(len(msg.data))
        started = time.perf_counter()
        status = "error"
        try:
            status = await self._settle(msg, handler)
        except Exception:
            # An ack or a dead-letter publish that failed (disconnected): the message is
            # redelivered after the consumer's ack_wait, and the service keeps running.
            log.exception("could not settle a message on %s", subject)
        finally:
            if counted is not None:
                counted[2].observe(time.perf_counter() - started)
                self.metrics.processed(handler, status)  # type: ignore[union-attr]

    async def _settle(self, msg: Msg, handler: str) -> str:
        """Parse, handle, then ack, nak or dead-letter the message; the status it ended with."""
        try:
            event = self.model.model_validate_json(msg.data)
        except (ValidationError, ValueError) as exc:
            assert self._connection is not None
            await dead_letter(self._connection, self.subjects, self.service, msg, msg.data, exc)
            await self._ack(msg)
            return "rejected"
        try:
            await self._call(event, msg)
        except RetryLater as retry:
            if self.stream is not None:
                await msg.nak(delay=retry.delay)
            return "nacked"
        except Conflict as exc:
            # Expected under load (a record changed by others between read and write, past
            # the retries): not an error; the message comes back and is handled again.
            log.info("%s on %s; it will be redelivered", exc, msg.subject)
            if self.stream is not None:
                await msg.nak(delay=CONTENDED_RETRY_S)
            return "contended"
        except Exception as exc:
            log.exception("handling a message on %s failed", msg.subject)
            if self.metrics is not None:
                self.metrics.exception(handler, exc)
            if self.stream is not None:
                await msg.nak()
            return "error"
        await self._ack(msg)
        return "acked"

    async def _call(self, event: BaseModel, msg: Msg) -> None:
        """The handler; in an ordered intake tried again in place while it fails with
        anything but ``RetryLater`` (the handler's own choice of a redelivery), for up to
        ``ORDERED_RETRY_S``, the message kept from redelivery meanwhile."""
        args = (event, msg) if self._with_msg else (event,)
        if self.ordered_by is None or self.stream is None:
            await self.handler(*args)
            return

        async def keep(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome else None
            log.info("handling %s failed (%r); trying it again first", msg.subject, failure)
            with contextlib.suppress(Exception):  # disconnected: the next try finds out
                await msg.in_progress()

        async for attempt in AsyncRetrying(
            stop=stop_after_delay(ORDERED_RETRY_S),
            wait=wait_exponential(multiplier=CONTENDED_RETRY_S, max=2.0),
            retry=retry_if_not_exception_type((RetryLater, asyncio.CancelledError)),
            before_sleep=keep,
            reraise=True,
        ):
            with attempt:
                await self.handler(*args)

    async def _ack(self, msg: Msg) -> None:
        if self.stream is not None:
            await msg.ack()

    def document(self, broker: NatsBroker) -> None:
        """Declare the handler as a FastStream subscriber of ``broker`` (never started), so that
        the AsyncAPI document lists its subject and payload like any other handler's."""
        options: dict[str, Any] = {}
        if self.stream is not None:
            options = {
                "stream": JStream(self.stream, declare=False),
                "durable": self.durable,
                "pull_sub": PullSub(batch_size=self.batch, timeout=1.0),
            }
        broker.subscriber(self.subject, **options)(self.handler)

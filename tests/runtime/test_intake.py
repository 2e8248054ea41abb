"""Intakes against a real nats-server: typed parsing, dead-lettering, redelivery, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import nats
import pytest
import yaml
from faststream.nats import NatsBroker, TestNatsBroker
from faststream.specification import AsyncAPI
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from swarm_contracts.envelope import CloudEvent, envelope
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker
from swarm_runtime.intake import Intake, IntakeMetrics, RawMsg, RetryLater
from swarm_runtime.prometheus import nats_metrics_middleware
from swarm_runtime.records import Conflict
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology

from ..conftest import Samples, sample


class Ping(BaseModel):
    n: int


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    await ensure_topology(client.jetstream(), Subjects(settings.namespace))
    yield client
    await client.drain()


def _body(n: int) -> bytes:
    return envelope("test", "swarm.test.ping", Ping(n=n)).model_dump_json().encode()


async def _until(check: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _stream_intake(
    s: Subjects, handler: object, registry: CollectorRegistry | None = None, **options: object
) -> Intake:
    """An intake on the submit stream's subject (any stream would do)."""
    config = ConsumerConfig(
        durable_name="intake-test", ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=5
    )
    metrics = IntakeMetrics(registry, "svc") if registry is not None else None
    return Intake(
        "svc",
        s,
        s.submit,
        handler,  # type: ignore[arg-type]
        stream=s.submit_stream,
        durable="intake-test",
        config=config,
        metrics=metrics,
        **options,  # type: ignore[arg-type]
    )


async def test_a_core_handler_gets_the_typed_message_and_its_raw_one(
    nc: Client, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    got: list[tuple[int, str]] = []

    async def on_ping(event: CloudEvent[Ping], msg: RawMsg) -> None:
        got.append((event.data.n, msg.subject))

    intake = Intake("svc", s, s.heartbeat(), on_ping)
    assert intake.model == CloudEvent[Ping]
    await intake.start(nc)
    await nc.publish(s.heartbeat("w1"), _body(7))
    await _until(lambda: got)
    assert got == [(7, s.heartbeat("w1"))]
    await intake.stop()
    assert not intake.running
    await nc.publish(s.heartbeat("w1"), _body(8))
    await nc.flush()
    await asyncio.sleep(0.2)
    assert got == [(7, s.heartbeat("w1"))]


@contextlib.asynccontextmanager
async def collecting(nc: Client, s: Subjects) -> AsyncIterator[list[int]]:
    """A running stream intake that collects the pings it handles."""
    got: list[int] = []

    async def on_ping(event: CloudEvent[Ping]) -> None:
        got.append(event.data.n)

    intake = _stream_intake(s, on_ping)
    await intake.start(nc)
    try:
        yield got
    finally:
        await intake.stop()


async def test_malformed_input_is_dead_lettered_and_the_next_message_handled(
    nc: Client, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    js = nc.jetstream()
    async with collecting(nc, s) as got:
        await js.publish(s.submit, b'{"not": "a cloud event"}')
        await js.publish(s.submit, b"\xff\xfe not even utf-8")
        await js.publish(s.submit, _body(1))
        await _until(lambda: got == [1])
        dlq = await js.subscribe(s.dead_letter("svc"), ordered_consumer=True)
        parked = [await dlq.next_msg(timeout=5) for _ in range(2)]
        assert [m.data for m in parked] == [b'{"not": "a cloud event"}', b"\xff\xfe not even utf-8"]
        assert all(m.headers["Swarm-Original-Subject"] == s.submit for m in parked)
        assert "validation error" in parked[0].headers["Swarm-Error"]
    # Acked: nothing is left for the consumer to deliver again.
    info = await js.consumer_info(s.submit_stream, "intake-test")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


async def test_a_failing_handler_has_its_message_redelivered(
    nc: Client, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    registry = CollectorRegistry()
    attempts: list[float] = []

    async def on_ping(event: CloudEvent[Ping]) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RuntimeError("the store is down")
        if len(attempts) == 2:
            raise RetryLater(0.5)

    intake = _stream_intake(s, on_ping, registry)
    await intake.start(nc)
    try:
        await nc.jetstream().publish(s.submit, _body(1))
        await _until(lambda: len(attempts) == 3)
    finally:
        await intake.stop()
    # An error is redelivered at once, RetryLater after its delay.
    assert attempts[1] - attempts[0] < 0.4
    assert attempts[2] - attempts[1] >= 0.45
    scraped: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for one in family.samples:
            scraped.setdefault(one.name, []).append((one.labels, one.value))
    handler = f"{settings.namespace}.swarm.jobs.submit"
    assert sample(scraped, "swarm_svc_received_messages_total", handler=handler) == 3
    processed = "swarm_svc_received_processed_messages_total"
    assert sample(scraped, processed, handler=handler, status="error") == 1
    assert sample(scraped, processed, handler=handler, status="nacked") == 1
    assert sample(scraped, processed, handler=handler, status="acked") == 1
    exceptions = "swarm_svc_received_processed_messages_exceptions_total"
    assert sample(scraped, exceptions, exception_type="RuntimeError") == 1


async def test_a_contended_record_is_handled_again_without_an_error_logged(
    nc: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    s = Subjects(settings.namespace)
    registry = CollectorRegistry()
    attempts: list[int] = []

    async def on_ping(event: CloudEvent[Ping]) -> None:
        attempts.append(event.data.n)
        if len(attempts) == 1:
            raise Conflict("job-1: too many concurrent changes")

    intake = _stream_intake(s, on_ping, registry)
    await intake.start(nc)
    try:
        await nc.jetstream().publish(s.submit, _body(7))
        await _until(lambda: len(attempts) == 2)
    finally:
        await intake.stop()
    assert attempts == [7, 7]
    # Expected contention: an info line, no traceback, no error count.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("too many concurrent changes" in r.getMessage() for r in caplog.records)
    scraped: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for one in family.samples:
            scraped.setdefault(one.name, []).append((one.labels, one.value))
    handler = f"{settings.namespace}.swarm.jobs.submit"
    processed = "swarm_svc_received_processed_messages_total"
    assert sample(scraped, processed, handler=handler, status="contended") == 1
    assert sample(scraped, processed, handler=handler, status="acked") == 1


async def test_skipped_subjects_are_acked_unread_and_a_stopped_intake_resumes(
    nc: Client, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    js = nc.jetstream()
    got: list[str] = []

    async def on_event(event: CloudEvent[Ping], msg: Msg) -> None:
        got.append(msg.subject.rpartition(".")[2])

    config = ConsumerConfig(durable_name="ev", ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
    options = {"stream": s.events_stream, "durable": "ev", "config": config}
    skip = lambda subject: subject.endswith(".mine")  # noqa: E731
    intake = Intake("svc", s, s.job_event(), on_event, skip=skip, **options)  # type: ignore[arg-type]
    await intake.start(nc)
    # Not even parsed: a skipped message need not match the contract.
    await js.publish(s.job_event("job-1", "mine"), b"anything")
    await js.publish(s.job_event("job-1", "theirs"), _body(1))
    await _until(lambda: got == ["theirs"])
    await intake.stop()

    # The durable consumer outlives the intake: what came meanwhile is handled after a restart.
    await js.publish(s.job_event("job-2", "later"), _body(2))
    again = Intake("svc", s, s.job_event(), on_event, skip=skip, **options)  # type: ignore[arg-type]
    await again.start(nc)
    try:
        await _until(lambda: got == ["theirs", "later"])
    finally:
        await again.stop()
    info = await js.consumer_info(s.events_stream, "ev")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


def test_document_declares_the_subject_and_payload_for_asyncapi(settings: Settings) -> None:
    s = Subjects("")
    broker = make_broker(settings, "svc")

    async def on_ping(event: CloudEvent[Ping], msg: RawMsg) -> None:
        """Pings, counted."""

    _stream_intake(s, on_ping).document(broker)
    spec = yaml.safe_load(AsyncAPI(broker, title="t").to_specification().to_yaml())
    (channel,) = spec["channels"].values()
    assert channel["address"] == "swarm.jobs.submit"
    assert channel["description"] == "Pings, counted."
    # The payload is the contract alone: the raw message is FastStream context.
    (message,) = spec["components"]["messages"].values()
    assert message["payload"]["$ref"] == "#/components/schemas/CloudEvent%5BPing%5D"


async def test_a_consumer_deleted_under_a_running_intake_is_made_again(
    nc: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As after a nats-server restarted without its store: the pulls would otherwise wait for
    # ever on a consumer that no longer exists.
    monkeypatch.setattr("swarm_runtime.intake.IDLE_CHECK_S", 0.5)
    s = Subjects(settings.namespace)
    js = nc.jetstream()
    async with collecting(nc, s) as got:
        await js.publish(s.submit, _body(1))
        await _until(lambda: got == [1])
        await js.delete_consumer(s.submit_stream, "intake-test")
        await asyncio.sleep(2.0)  # idle past the check: the consumer is made again
        await js.publish(s.submit, _body(2))
        await _until(lambda: 2 in got)


async def test_intakes_and_faststream_subscribers_count_into_one_set_of_families() -> None:
    registry = CollectorRegistry()
    counted = IntakeMetrics(registry, "svc")
    # Made second, FastStream's middleware finds the intakes' families and counts into them.
    broker = NatsBroker(middlewares=[nats_metrics_middleware(registry, "svc")])

    @broker.subscriber("swarm.test.fast")
    async def on_fast(event: Ping) -> None:
        pass

    async with TestNatsBroker(broker) as test_broker:
        await test_broker.publish(Ping(n=1), "swarm.test.fast")
    counted.of("swarm.test.slow")[0].inc()
    scraped = text_string_to_metric_families(generate_latest(registry).decode())
    received = next(f for f in scraped if f.name == "swarm_svc_received_messages")
    handlers = {one.labels["handler"] for one in received.samples if one.name.endswith("_total")}
    assert handlers == {"swarm.test.fast", "swarm.test.slow"}


async def test_an_ordered_intake_keeps_each_keys_order_through_a_failure(
    nc: Client, settings: Settings
) -> None:
    """A job's events relayed out of order once (a NATS restart failed one, its redelivery came
    after the next ones): in an ordered intake the failing message is tried again first, its
    key's later messages waiting, other keys not."""
    s = Subjects(settings.namespace)
    handled: dict[str, list[int]] = {"a": [], "b": []}
    failures = 0

    async def on_ping(event: CloudEvent[Ping], msg: RawMsg) -> None:
        nonlocal failures
        job = Subjects.job_of_worker_event(msg.subject)
        # Job a's second message fails until all of job b's are through: b must not wait on a.
        if job == "a" and event.data.n == 2 and len(handled["b"]) < 3:
            failures += 1
            raise RuntimeError("NATS is restarting")
        handled[job].append(event.data.n)

    config = ConsumerConfig(
        durable_name="ordered-test", ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=5
    )
    intake = Intake(
        "svc",
        s,
        s.worker_event(),
        on_ping,
        stream=s.worker_events_stream,
        durable="ordered-test",
        config=config,
        ordered_by=Subjects.job_of_worker_event,
    )
    js = nc.jetstream()
    for n in range(1, 7):
        await js.publish(s.worker_event("w1", "a", "progress"), _body(n))
    await intake.start(nc)
    try:
        for n in range(1, 4):
            await js.publish(s.worker_event("w1", "b", "progress"), _body(n))
        await _until(lambda: len(handled["a"]) == 6)
    finally:
        await intake.stop()
    assert failures >= 1
    assert handled == {"a": [1, 2, 3, 4, 5, 6], "b": [1, 2, 3]}


def _ordered(s: Subjects, on_ping: object, ack_wait: float) -> Intake:
    config = ConsumerConfig(
        durable_name="ordered-test", ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait
    )
    return Intake(
        "svc",
        s,
        s.worker_event(),
        on_ping,  # type: ignore[arg-type]
        stream=s.worker_events_stream,
        durable="ordered-test",
        config=config,
        ordered_by=Subjects.job_of_worker_event,
    )


async def test_an_ordered_intake_taking_over_handles_its_dead_holders_messages_first(
    nc: Client, settings: Settings
) -> None:
    """A scheduler leader killed while it held job a's first event: the next leader's intake
    waits for that event's redelivery rather than relaying a's later events before it."""
    s = Subjects(settings.namespace)
    handled: dict[str, list[int]] = {"a": [], "b": []}

    async def on_ping(event: CloudEvent[Ping], msg: RawMsg) -> None:
        handled[Subjects.job_of_worker_event(msg.subject)].append(event.data.n)

    js = nc.jetstream()
    intake = _ordered(s, on_ping, ack_wait=2)
    await js.publish(s.worker_event("w1", "a", "progress"), _body(1))
    dead = await js.pull_subscribe(
        s.worker_event(),
        durable="ordered-test",
        stream=s.worker_events_stream,
        config=intake.config,
    )
    assert len(await dead.fetch(1, timeout=5)) == 1  # held, never settled: its holder died
    for n in (2, 3):
        await js.publish(s.worker_event("w1", "a", "progress"), _body(n))
    await js.publish(s.worker_event("w1", "b", "progress"), _body(1))
    await intake.start(nc)
    try:
        await _until(lambda: len(handled["a"]) == 3 and handled["b"], within=15)
    finally:
        await intake.stop()
    assert handled == {"a": [1, 2, 3], "b": [1]}


async def test_a_message_held_past_ack_wait_is_not_redelivered(
    nc: Client, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    calls: list[int] = []

    async def on_ping(event: CloudEvent[Ping], msg: RawMsg) -> None:
        calls.append(event.data.n)
        if event.data.n == 1:
            await asyncio.sleep(5.5)  # a slow handler: past twice the consumer's ack_wait

    intake = _ordered(s, on_ping, ack_wait=2.5)
    js = nc.jetstream()
    await js.publish(s.worker_event("w1", "a", "progress"), _body(1))
    await js.publish(s.worker_event("w1", "a", "progress"), _body(2))
    await intake.start(nc)
    try:
        await _until(lambda: calls == [1, 2], within=15)
        await asyncio.sleep(3.0)  # a redelivery, had there been one, would have come by now
    finally:
        await intake.stop()
    assert calls == [1, 2]

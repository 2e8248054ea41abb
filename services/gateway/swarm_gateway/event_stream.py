"""Server-Sent Events from a JetStream stream: a job's or a sweep's events, replayed then live.

The SSE id of an event is its sequence in the stream, so a client that reconnects with
``Last-Event-ID`` gets exactly the events after that one (the replay starts one past it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

import nats.errors
from fastapi import Header, Request
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from sse_starlette.sse import ServerSentEvent

from swarm_gateway.errors import field_error
from swarm_gateway.state import Gateway

# The header as the document states it: digits only (a stream sequence), so that a value the
# replay would refuse ("null", "-1") is outside the schema as well; not nullable, since a
# header has no null (an optional str would be documented as one, and sent as "null").
LastEventId = Annotated[
    str,
    Header(pattern=r"^[0-9]{0,19}$", description="the SSE id of the last event received"),
]

# How long a stream that saw the final event waits for the record to show it: the writer's
# next step after its publish, but on a starved machine that has taken more than 5 s. Only a
# writer that crashed in between (its successor writes it) makes a client wait this long.
SETTLE_S = 30.0


def start_sequence(last_event_id: str | None) -> int:
    """Where a replay starts: one past ``Last-Event-ID``, or 0 for the whole history."""
    if not last_event_id:
        return 0
    try:
        start_seq = int(last_event_id) + 1
        if start_seq < 1:
            raise ValueError(last_event_id)
    except ValueError as exc:
        raise field_error(422, ["header", "Last-Event-ID"], "must be a stream sequence") from exc
    return start_seq


async def follow(
    gw: Gateway,
    subject: str,
    stream: str,
    start_seq: int,
    request: Request,
    *,
    ends: Callable[[str, bytes], Awaitable[bool]],
    over: Callable[[], Awaitable[bool]],
) -> AsyncIterator[ServerSentEvent]:
    """The events on ``subject`` until one ``ends`` the stream (given its name and body), or
    until the history is over (``over``) and every event of it was sent, or, idle, after
    ``gw.event_stream_max_s`` (when set).

    A final event is published before the record change it announces (so that a crash in
    between cannot lose it), so the stream waits, briefly, for ``over`` before it ends: a client
    that reads the job or sweep once its events end sees the final state."""
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
        if start_seq > 0
        else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    sub = await gw.js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                if await request.is_disconnected():
                    return
                # Caught up and it is over (e.g. a reconnect after the final event): nothing
                # more will come, so end the stream instead of idling forever.
                if await over() and await _caught_up(sub):
                    return
                # A bounded stream (``Gateway.event_stream_max_s``) ends when idle; the
                # client reconnects with Last-Event-ID and loses nothing.
                limit = gw.event_stream_max_s
                if limit is not None and loop.time() - started >= limit:
                    return
                continue
            name = msg.subject.rsplit(".", 1)[-1]
            yield ServerSentEvent(
                data=msg.data.decode(), event=name, id=str(msg.metadata.sequence.stream)
            )
            if await ends(name, msg.data):
                await _settled(over)
                return
    finally:
        # The connection may already be closing on shutdown.
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _settled(over: Callable[[], Awaitable[bool]]) -> None:
    # Polled (the record's change has no event of its own to wait on here), soon at first and
    # then less often: it is usually a matter of milliseconds.
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + SETTLE_S, 0.05
    while not await over() and loop.time() < deadline:
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


async def _caught_up(sub: JetStreamContext.PushSubscription) -> bool:
    """Nothing left on the server or in the client's buffer: a slow consumer is not caught up."""
    try:
        info = await sub.consumer_info()
    except Exception:
        return False
    return info.num_pending == 0 and sub.pending_msgs == 0

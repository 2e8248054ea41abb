"""Session calls to workers, and their futures.

``send`` records the call's future (pending) and publishes the call on the worker's session
subject with a reply subject of this gateway's own; it returns once the call is on the wire, so
that a session's calls leave in the order the client made them. The worker's reply (or NATS's
"no responders") settles the future in the KV bucket, where any gateway answers
``retrieve_future`` from: a future outlives the client's connection. Each future names the
gateway answering for it (its inbox, which answers ``alive`` pings): when that gateway dies,
another adopts the future (tinker.sessions.adopt) and asks the worker for its answer again. A
future nobody settled by its deadline (the worker died mid-call) reads as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from pydantic import ValidationError

from swarm_contracts.replies import Reply
from swarm_contracts.sessions import SessionCall, SessionResult
from swarm_contracts.subjects import Subjects
from swarm_gateway.tinker.records import FutureRecord
from swarm_runtime.records import RecordTable
from swarm_runtime.tracing import trace_headers

log = logging.getLogger(__name__)

# How long a settled call's event is kept set for a late ``wait``.
SETTLED_KEPT_S = 30.0

# What a settled future does before anyone reads it settled (its ``follow_up``: mark the model
# ready, register the weights saved for sampling): given the record as the worker settled it,
# the record to keep (the same, or one it changed: a registration that failed fails the future).
OnSettled = Callable[[FutureRecord], Awaitable[FutureRecord]]
# How long a ping of another gateway's inbox waits: a gateway that is busy, not dead, answers
# late (it keeps the future); a dead one has no subscription, and NATS says so at once.
ALIVE_TIMEOUT_S = 2.0
# What a call that found no worker listening tells its caller (``tinker.sessions.restore``), or
# None where the call itself moved to another worker (a ``create``): still pending there.
OnLost = Callable[[FutureRecord], Awaitable[str | None]]


class Calls:
    def __init__(
        self, nc: NatsClient, subjects: Subjects, futures: RecordTable[FutureRecord]
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.futures = futures
        self.inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._alive: Subscription | None = None
        self._settled: dict[str, asyncio.Event] = {}
        # Set by the app: the follow-ups of settled futures (tinker.follow_ups).
        self.follow_up: OnSettled | None = None
        # Set by the app: run again a sample adopted from a dead gateway (its kept request).
        self.resample: Callable[[FutureRecord], Awaitable[None]] | None = None
        # Set by the app: the model of a call nobody answered is restored elsewhere.
        self.on_lost: OnLost | None = None
        # Set by the app: each settled call's timing, for Prometheus.
        self.on_timed: Callable[[FutureRecord], None] | None = None

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self.inbox}.*.*", cb=self._on_reply)
        self._alive = await self.nc.subscribe(f"{self.inbox}.alive", cb=self._on_ping)

    async def stop(self) -> None:
        for sub in (self._sub, self._alive):
            if sub is not None:
                await sub.unsubscribe()

    async def answers(self, gateway: str) -> bool:
        """Whether the gateway of inbox ``gateway`` is alive (answers, or is too busy to in
        time); False once nothing listens there: it died, or left NATS."""
        if gateway == self.inbox:
            return True
        try:
            await self.nc.request(f"{gateway}.alive", b"", timeout=ALIVE_TIMEOUT_S)
        except NoRespondersError:
            return False
        except TimeoutError:
            return True
        return True

    async def _on_ping(self, msg: Msg) -> None:
        await msg.respond(b"")

    async def send(self, worker_id: str, call: SessionCall, future: FutureRecord) -> None:
        """Record ``future`` pending (answered for by this gateway) and send ``call``."""
        seq_id = future.seq_id if call.op == "answer_again" else call.seq_id
        update = {"attempt": call.attempt, "gateway": self.inbox, "seq_id": seq_id}
        future = future.model_copy(update=update)
        await self.futures.put(future.request_id, future)
        self._settled[future.request_id] = asyncio.Event()
        await self.nc.publish(
            self.subjects.worker_session(worker_id, call.session),
            call.model_dump_json().encode(),
            # The attempt in the reply subject fences a reply from a worker the call has
            # since moved off (a frozen one that wakes): only the current attempt settles it.
            reply=f"{self.inbox}.{future.request_id}.{call.attempt}",
            headers=trace_headers(),
        )

    def expect(self, request_id: str) -> None:
        """A future this gateway settles itself (a sample): ``wait`` wakes at ``settled``."""
        self._settled[request_id] = asyncio.Event()

    def settled(self, request_id: str, future: FutureRecord | None = None) -> None:
        """Wake ``wait``; with the settled ``future``, count its timing. The event stays set a
        while: a ``retrieve_future`` that read the record pending just before the reply came
        must not then sleep, unwoken (it cost up to half a second a call)."""
        event = self._settled.get(request_id)
        if event is not None:
            event.set()
            loop = asyncio.get_running_loop()
            loop.call_later(SETTLED_KEPT_S, self._settled.pop, request_id, None)
        if future is not None and self.on_timed is not None:
            self.on_timed(future)

    async def wait(self, request_id: str, timeout: float) -> None:
        """Until this gateway saw the future settled, or ``timeout``; a future another gateway
        sent is only read again (the caller's next read of the record)."""
        event = self._settled.get(request_id)
        if event is None:
            await asyncio.sleep(min(timeout, 0.5))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def _on_reply(self, msg: Msg) -> None:
        request_id, attempt = msg.subject.rsplit(".", 2)[-2:]
        try:
            await self._settle(request_id, int(attempt), msg)
        except Exception:  # a reply (even to a made-up subject) must never take the sub down
            log.exception("could not settle the future %s", request_id)

    async def _settle(self, request_id: str, attempt: int, msg: Msg) -> None:
        found = await self.futures.get(request_id)
        if found is None:
            log.warning("a reply for the unknown future %s: dropped", request_id)
            return
        future, revision = found
        if attempt != future.attempt or future.state != "pending":
            log.warning(
                "a stale reply (attempt %d) for the future %s: dropped", attempt, request_id
            )
            return
        if msg.headers and msg.headers.get("Status") == "503":
            future.state, future.category = "failed", "server"
            future.error = "the worker holding this session is not listening (gone?)"
            if self.on_lost is not None:
                error = await self.on_lost(future)
                if error is None:  # moved: its send to the other worker owns the future now
                    return
                future.error = error
        else:
            try:
                reply = Reply[SessionResult].model_validate_json(msg.data)
            except ValidationError as exc:
                log.warning("a malformed reply for future %s: %s", request_id, exc)
                future.state, future.category = "failed", "server"
                future.error = "the worker sent a malformed reply"
            else:
                if reply.ok and reply.result is not None:
                    future.state, future.result = "done", reply.result
                else:
                    future.state = "failed"
                    # The worker's refusals of bad input are the caller's mistake.
                    user = reply.code in ("invalid", "not_found", "conflict")
                    future.category = "user" if user else "server"
                    future.error = reply.error or "the worker refused the call"
        if future.follow_up is not None and self.follow_up is not None:
            try:
                future = await self.follow_up(future)
            except Exception as exc:
                log.exception("settling the future %s failed", request_id)
                future.state, future.category = "failed", "server"
                future.error = f"the call ran, but what follows it failed: {exc}"
        future.done_at = time.time()
        await self.futures.update(request_id, future, revision)
        self.settled(request_id, future)

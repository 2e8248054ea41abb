"""Leader election among a service's processes through the ``leader`` KV bucket.

One key per service (``scheduler``, ``sweeps``): the leader holds it and renews it by
compare-and-set about three times per lease. A follower takes over, by compare-and-set on the
revision it saw, only when that revision has not moved for a whole lease by its own clock *and*
the leader's timestamp is a lease old, so neither a slow watch nor clock skew alone makes two
leaders. A leader that cannot renew stops acting before a follower could take over. Job records
(and the sweeps controller's records) are changed only by compare-and-set, so even an overlap
could not assign one attempt twice; the lease just keeps the overlap from happening in the
first place.

``Leadership`` is the election; ``Lead`` is what a led service builds on it (the scheduler and
the sweeps controller): its seat in the election, the work-queue consumers only the leader
runs, and the check its handlers make before acting on a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from swarm_contracts.subjects import Subjects
from swarm_runtime.intake import Intake, RetryLater
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import kv_bucket

log = logging.getLogger("swarm.leader")
# A follower that still got a leader-only message gives it back for the leader after this long.
FOLLOWER_NACK_DELAY_S = 0.5


class Leadership:
    def __init__(
        self,
        kv: KeyValue,
        key: str,
        holder: str,
        lease_s: float,
        on_change: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.kv = kv
        self.key = key
        self.holder = holder
        self.lease_s = lease_s
        self.on_change = on_change
        self.leading = False
        self._revision = 0  # ours, while leading
        self._renewed = 0.0
        self._seen: tuple[int, float] = (0, 0.0)  # the other's revision and when it last moved
        self._task: asyncio.Task[None] | None = None

    def _payload(self) -> bytes:
        return json.dumps({"holder": self.holder, "time": time.time()}).encode()

    async def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.warning(
                "%s is %s of %s", self.holder, "the leader" if leading else "a follower", self.key
            )
            await self.on_change(leading)

    async def tick(self) -> None:
        now = time.monotonic()
        if self.leading:
            try:
                self._revision = await self.kv.update(
                    self.key, self._payload(), last=self._revision
                )
                self._renewed = now
            except KeyWrongLastSequenceError:
                await self._set(False)  # someone took over: we were too slow
            except Exception:
                # NATS unreachable: stop acting before a follower may decide we are gone.
                if now - self._renewed > self.lease_s * 2 / 3:
                    await self._set(False)
            return
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            entry = None
        try:
            if entry is None or entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                self._revision = await self.kv.create(self.key, self._payload())
            else:
                if entry.revision is not None and entry.revision != self._seen[0]:
                    self._seen = (entry.revision, now)
                written = float(json.loads(entry.value).get("time", 0))
                if now - self._seen[1] < self.lease_s or time.time() - written < self.lease_s:
                    return
                self._revision = await self.kv.update(
                    self.key, self._payload(), last=entry.revision
                )
        except KeyWrongLastSequenceError:
            return  # another follower was faster
        self._renewed = now
        await self._set(True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("leadership check failed")
            await asyncio.sleep(self.lease_s / 3)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop, and hand the lease back at once so that a follower need not wait it out."""
        await cancel_and_wait([self._task])
        if self.leading:
            with contextlib.suppress(Exception):
                await self.kv.delete(self.key, last=self._revision)
            await self._set(False)


class Lead:
    """A service process's seat in its service's election (key ``service`` of the ``leader``
    bucket), and what follows from it.

    On each change the service's own ``on_change`` runs first (a new leader loads its state and
    restarts its clocks), then the intakes given to ``leader_only`` are started (leader) or
    stopped (follower): they are durable pull consumers shared as work queues, so a follower
    that pulled would take messages away from the leader. The handlers of those messages call
    ``check()`` too, so a consumer left in the wrong state delays messages but never lets a
    follower act on them.
    """

    def __init__(
        self, service: str, on_change: Callable[[bool], Awaitable[None]] | None = None
    ) -> None:
        self.service = service
        self.holder = f"{service}-{uuid.uuid4().hex[:8]}"
        self.on_change = on_change
        self.leadership: Leadership | None = None
        self._intakes: list[Intake] = []
        self._connect: Callable[[], Client] = _no_connection

    @property
    def leading(self) -> bool:
        return self.leadership is not None and self.leadership.leading

    def leader_only(self, intakes: list[Intake], connection: Callable[[], Client]) -> None:
        """Run ``intakes`` on the leader only, on the connection ``connection()`` gives once
        it is open."""
        self._intakes = intakes
        self._connect = connection

    def check(self) -> None:
        """In a handler of a leader-only message: a follower that still got one (in the moment
        before its consumers stopped) gives it back for the leader."""
        if not self.leading:
            raise RetryLater(FOLLOWER_NACK_DELAY_S)

    async def prepare(self, js: JetStreamContext, subjects: Subjects, lease_s: float) -> None:
        """Join the election, and take part in it once, so that whether this process leads is
        decided before it starts serving."""
        kv = await kv_bucket(js, subjects, "leader")
        self.leadership = Leadership(kv, self.service, self.holder, lease_s, self._changed)
        await self.leadership.tick()

    def start(self) -> None:
        assert self.leadership is not None, "prepare() first"
        self.leadership.start()

    async def stop(self) -> None:
        """Leave the election, handing the lease back if this process holds it."""
        if self.leadership is not None:
            await self.leadership.stop()

    async def follow(self, leading: bool) -> None:
        """Start (leader) or stop (follower) the leader-only intakes."""
        for intake in self._intakes:
            try:
                if leading and not intake.running:
                    await intake.start(self._connect())
                elif not leading and intake.running:
                    await intake.stop()
            except Exception:
                log.exception("could not %s a consumer", "start" if leading else "stop")

    async def _changed(self, leading: bool) -> None:
        if self.on_change is not None:
            await self.on_change(leading)
        await self.follow(leading)


def _no_connection() -> Client:
    raise RuntimeError("leader_only() was not given the intakes' connection")

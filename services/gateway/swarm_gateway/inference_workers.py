"""The inference workers the gateway has heard from: their latest heartbeat, kept in memory.

Heartbeats are core NATS (only the latest matters), so every gateway subscribes to them
itself; a worker silent for three heartbeat intervals is no longer listed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import ValidationError

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.inference import InferenceHeartbeat
from swarm_contracts.subjects import Subjects

log = logging.getLogger(__name__)


class InferenceWorkers:
    def __init__(self, subjects: Subjects, heartbeat_interval_s: float) -> None:
        self.subjects = subjects
        self.expiry_s = 3 * heartbeat_interval_s
        self._latest: dict[str, tuple[float, InferenceHeartbeat]] = {}
        self._sub: Any = None

    async def start(self, nc: Client) -> None:
        self._sub = await nc.subscribe(self.subjects.inference_heartbeat(), cb=self._on_heartbeat)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may be closed already
                log.debug("unsubscribing from inference heartbeats failed", exc_info=True)
            self._sub = None

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = CloudEvent[InferenceHeartbeat].model_validate_json(msg.data).data
        except ValidationError as exc:
            log.warning("ignoring a malformed inference heartbeat on %s: %s", msg.subject, exc)
            return
        self._latest[beat.worker_id] = (time.monotonic(), beat)

    def alive(self) -> list[InferenceHeartbeat]:
        now = time.monotonic()
        for worker_id, (seen, _) in list(self._latest.items()):
            if now - seen > self.expiry_s:
                del self._latest[worker_id]
        return sorted((b for _, b in self._latest.values()), key=lambda b: b.worker_id)

    def serving(self, name: str, version: int) -> list[InferenceHeartbeat]:
        return [
            b
            for b in self.alive()
            if any(m.name == name and m.version == version for m in b.base_models)
        ]

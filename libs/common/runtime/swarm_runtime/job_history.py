"""A job's past events of one kind, read back from the replayable events stream."""

from __future__ import annotations

import json
from typing import Any

from nats.js import JetStreamContext

from swarm_contracts.subjects import Subjects

READ_TIMEOUT_S = 2.0


async def past_events(
    js: JetStreamContext, subjects: Subjects, job_id: str, event: str
) -> list[dict[str, Any]]:
    """The ``data`` of every ``event`` of ``job_id`` stored so far, oldest first. Raises on any
    trouble reading (a job without such events included: nothing arrives in time), which the
    callers, all best effort, turn into a warning."""
    found: list[dict[str, Any]] = []
    sub = await js.subscribe(subjects.job_event(job_id, event), ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
            found.append(json.loads(msg.data).get("data") or {})
            if msg.metadata.num_pending == 0:
                return found
    finally:
        await sub.unsubscribe()

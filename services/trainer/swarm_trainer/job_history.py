"""What earlier attempts of a job did, read back from the job's replayable event history."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext

from swarm_contracts.subjects import Subjects
from swarm_runtime.job_history import past_events

log = logging.getLogger(__name__)


async def workers_that_ran(
    js: JetStreamContext, subjects: Subjects, job_id: str, attempt: int, worker_id: str
) -> list[str]:
    """Every worker that started an attempt of ``job_id`` up to ``attempt``, first come first,
    ending with ``worker_id`` (this one). A job that moved after a worker was lost was trained
    by several; the history is best effort, so any trouble reading it yields this worker only.
    """
    try:
        started = await past_events(js, subjects, job_id, "started")
    except Exception as exc:  # lineage without the history beats no registration
        log.warning("could not read the start history of %s: %r", job_id, exc)
        started = []
    seen = [
        str(data["worker_id"])
        for data in started
        if data.get("attempt", 0) <= attempt and data.get("worker_id")
    ]
    ordered = [w for w in dict.fromkeys(seen) if w != worker_id]
    return [*ordered, worker_id]

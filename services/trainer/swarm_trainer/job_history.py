"""What earlier attempts of a job did, read back from the job's replayable event history."""

from __future__ import annotations

import json
import logging

from nats.js import JetStreamContext

from swarm_contracts.subjects import Subjects

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 2.0


async def workers_that_ran(
    js: JetStreamContext, subjects: Subjects, job_id: str, attempt: int, worker_id: str
) -> list[str]:
    """Every worker that started an attempt of ``job_id`` up to ``attempt``, first come first,
    ending with ``worker_id`` (this one). A job that moved after a worker was lost was trained
    by several; the history is best effort, so any trouble reading it yields this worker only.
    """
    seen: list[str] = []
    try:
        sub = await js.subscribe(subjects.job_event(job_id, "started"), ordered_consumer=True)
        try:
            while True:
                msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
                data = json.loads(msg.data).get("data") or {}
                if data.get("attempt", 0) <= attempt and data.get("worker_id"):
                    seen.append(str(data["worker_id"]))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    except Exception as exc:  # lineage without the history beats no registration
        log.warning("could not read the start history of %s: %r", job_id, exc)
    ordered = [w for w in dict.fromkeys(seen) if w != worker_id]
    return [*ordered, worker_id]

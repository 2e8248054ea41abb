"""Submitting a job: the one way in for ``POST /v1/jobs`` and ``POST /v1/fine_tuning/jobs``.

The submission goes to the submit stream (``Nats-Msg-Id`` = job id, so a retry is dropped by
the stream itself); the scheduler creates the record, which the gateway waits for briefly.
"""

from __future__ import annotations

import asyncio

from fastapi import status

from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobRecord, JobSpec, JobState, JobSubmission
from swarm_gateway.state import Gateway
from swarm_runtime.tracing import trace_headers


async def submit(gw: Gateway, tenant: str, spec: JobSpec, job_id: str) -> tuple[JobRecord, int]:
    """The job's record and the status to answer with: 200 (a job with this id exists
    already), 201 (the scheduler created it), or 202 (accepted; no record yet, so the record
    returned is what it will be)."""
    existing = await gw.jobs.get(job_id)
    if existing is not None:
        return existing[0], status.HTTP_200_OK

    submission = JobSubmission(spec=spec, tenant=tenant, job_id=job_id)
    event = envelope("gateway", "swarm.job.submit", submission, subject=job_id)
    # The job's trace starts here; the scheduler continues it from the traceparent header.
    attributes = {"swarm.job_id": job_id, "swarm.tenant": tenant}
    with gw.tracer.start_as_current_span("gateway.submit", attributes=attributes):
        await gw.publish(
            gw.subjects.submit,
            event.model_dump_json().encode(),
            stream=gw.subjects.submit_stream,
            headers={"Nats-Msg-Id": job_id, "content-type": "application/json", **trace_headers()},
        )
    if gw.metrics is not None:
        gw.metrics.submissions.inc()

    loop = asyncio.get_running_loop()
    deadline = loop.time() + gw.submit_wait_s
    delay = 0.02
    while loop.time() < deadline:
        found = await gw.jobs.get(job_id)
        if found is not None:
            return found[0], status.HTTP_201_CREATED
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 0.25)
    pending = JobRecord(job_id=job_id, tenant=tenant, spec=spec, state=JobState.queued)
    return pending, status.HTTP_202_ACCEPTED

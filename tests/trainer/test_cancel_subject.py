"""The agent listens to cancellations on the control stream's subject without answering them.

A JetStream publish is a request whose reply is the stream's ack; a core-NATS subscriber that
answered it (FastStream answers a handler's ``None`` with an empty body) races the real ack,
and the gateway's ``js.publish`` now and then read that empty body as its ack (a 500 on
``POST /v1/jobs/{id}/cancel``).
"""

from __future__ import annotations

import uuid

import nats
import nats.errors
import pytest

from swarm_contracts.envelope import envelope
from swarm_contracts.events import CancelRequest
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings
from swarm_trainer.app import build_app
from swarm_trainer.settings import TrainerSettings

pytestmark = pytest.mark.slow


async def test_the_agent_never_answers_a_cancellation(
    ray_cluster: None, settings: Settings
) -> None:
    s = Subjects(settings.namespace)
    app = build_app(TrainerSettings.of(settings, worker_id="w-cancel"))
    await app.start()
    nc = await nats.connect(settings.nats_url)
    try:
        # Without the stream, the agent is the only one who could answer a request there.
        await nc.jetstream().delete_stream(s.control_stream)
        job_id = "job-" + uuid.uuid4().hex[:20]
        body = envelope("test", "swarm.job.cancel", CancelRequest(job_id=job_id))
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(s.cancel(job_id), body.model_dump_json().encode(), timeout=1.0)
    finally:
        await nc.close()
        await app.stop()

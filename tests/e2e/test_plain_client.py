"""docs/events.md's promise: a plain nats-py client, no Swarm code, submits and follows a job."""

from __future__ import annotations

import hashlib
import json

import nats
import pytest

from .conftest import Stack

pytestmark = pytest.mark.slow


async def test_a_plain_nats_client_submits_a_job_and_follows_it(stack: Stack) -> None:
    prefix = f"{stack.namespace}."  # the namespace tests run in; empty in production
    nc = await nats.connect(stack.local.nats_url)
    js = nc.jetstream()
    key = "plain-client-0001"
    job_id = "job-" + hashlib.sha256(f"default\x00{key}".encode()).hexdigest()[:20]
    sub = await js.subscribe(f"{prefix}swarm.jobs.{job_id}.events.*", ordered_consumer=True)
    request = {
        "specversion": "1.0",
        "id": key,
        "source": "example",
        "type": "swarm.job.submit",
        "data": {
            "tenant": "default",
            "spec": {
                "name": "plain-adapter",
                "base_model": "tiny-llama",
                "dataset": stack.train.id,
                "training": {"max_steps": 4, "batch_size": 2, "seq_len": 96, "eval_every": 4},
            },
        },
    }
    ack = await js.publish(
        f"{prefix}swarm.jobs.submit", json.dumps(request).encode(), headers={"Nats-Msg-Id": key}
    )
    assert not ack.duplicate
    seen = []
    while True:
        envelope = json.loads((await sub.next_msg(timeout=300)).data)
        assert envelope["specversion"] == "1.0"
        assert envelope["subject"] == job_id
        assert envelope["type"] == f"swarm.job.{envelope['data']['event']}"
        seen.append(envelope["data"]["event"])
        if seen[-1] in ("succeeded", "failed", "cancelled"):
            break
    await nc.close()
    assert seen[-1] == "succeeded", seen
    assert envelope["data"]["adapter"]["name"] == "plain-adapter"
    assert seen.count("progress") == 4

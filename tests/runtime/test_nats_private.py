"""Pins what swarm_runtime.nats_private reads from nats-py's KeyValue (real nats-server): a
nats-py upgrade that renames or changes them fails here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from swarm_contracts.subjects import Subjects
from swarm_runtime.nats_private import bucket_stream
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    yield client
    await client.drain()


async def test_a_buckets_stream_prefix_and_context_are_the_kv_protocols(
    nc: Client, namespace: str
) -> None:
    subjects = Subjects(namespace)
    kv = await kv_bucket(nc.jetstream(), subjects, "jobs")
    bucket = bucket_stream(kv)
    name = subjects.bucket("jobs")
    assert (bucket.stream, bucket.prefix) == (f"KV_{name}", f"$KV.{name}.")
    revision = await kv.put("job-1", b"{}")
    # The context works, and a key's entry is the message on prefix + key.
    last = await bucket.js.get_last_msg(bucket.stream, f"{bucket.prefix}job-1")
    assert (last.seq, last.data) == (revision, b"{}")

"""Streams and KV buckets against a real nats-server: created idempotently, namespaced."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarm_common.settings import Settings
from swarm_common.subjects import Subjects
from swarm_common.topology import BUCKETS, DAY, ensure_topology, kv_bucket, stream_configs


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    client = await nats.connect(settings.nats_url)
    yield client
    await client.drain()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


async def _stream_names(js: JetStreamContext, s: Subjects) -> set[str]:
    prefix = s.submit_stream.removesuffix("SWARM_SUBMIT")
    return {n for n in await js.streams_info() for n in [n.config.name] if n.startswith(prefix)}


async def test_ensure_topology_creates_everything(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    for config in stream_configs(s):
        info = await js.stream_info(config.name)
        assert info.config.subjects == config.subjects
        assert all(sub.startswith(f"{namespace}.swarm.") for sub in info.config.subjects)
    submit = await js.stream_info(s.submit_stream)
    assert submit.config.duplicate_window == DAY
    events = await js.stream_info(s.events_stream)
    assert events.config.subjects == [f"{namespace}.swarm.jobs.*.events.*"]
    for name in BUCKETS:
        kv = await js.key_value(s.bucket(name))
        status = await kv.status()
        assert status.bucket == s.bucket(name)
        assert status.history == 1


async def test_ensure_topology_is_idempotent(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    kv = await js.key_value(s.bucket("jobs"))
    await kv.put("job-1", b"kept")
    await js.publish(s.job_event("job-1", "queued"), b"{}")

    await ensure_topology(js, s)  # a second service start
    await ensure_topology(js, s)

    names = {c.name for c in stream_configs(s)}
    assert len(names) == 6
    # Nothing was recreated: the data written in between is still there.
    assert (await (await js.key_value(s.bucket("jobs"))).get("job-1")).value == b"kept"
    assert (await js.stream_info(s.events_stream)).state.messages == 1


async def test_ensure_topology_restores_changed_config(
    js: JetStreamContext, namespace: str
) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    config = next(c for c in stream_configs(s) if c.name == s.events_stream)
    changed = config.evolve(max_age=3600)
    await js.update_stream(changed)
    assert (await js.stream_info(s.events_stream)).config.max_age == 3600
    await ensure_topology(js, s)
    assert (await js.stream_info(s.events_stream)).config.max_age == 30 * DAY


async def test_namespaces_do_not_collide(js: JetStreamContext, namespace: str) -> None:
    a, b = Subjects(namespace), Subjects(namespace + "b")
    await ensure_topology(js, a)
    await ensure_topology(js, b)  # overlapping subjects would make this fail
    ack = await js.publish(a.job_event("j", "queued"), b"{}")
    assert ack.stream == a.events_stream
    ack = await js.publish(b.job_event("j", "queued"), b"{}")
    assert ack.stream == b.events_stream
    assert (await js.stream_info(a.events_stream)).state.messages == 1


async def test_submit_deduplicates_by_msg_id(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    first = await js.publish(s.submit, b"{}", headers={"Nats-Msg-Id": "job-1"})
    again = await js.publish(s.submit, b"{}", headers={"Nats-Msg-Id": "job-1"})
    assert not first.duplicate and again.duplicate
    assert (await js.stream_info(s.submit_stream)).state.messages == 1


async def test_contract_subjects_route_to_streams(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    routes = {
        s.submit: s.submit_stream,
        s.job_event("job-1", "succeeded"): s.events_stream,
        s.cancel("job-1"): s.control_stream,
        s.assign("w1"): s.assign_stream,
        s.adapter_registered("bot"): s.adapters_stream,
        s.dead_letter("gateway"): s.dead_letter_stream,
    }
    for subject, stream in routes.items():
        assert (await js.publish(subject, b"{}")).stream == stream
    # Heartbeats are core NATS only: no stream captures them.
    with pytest.raises(NotFoundError):
        await js.find_stream_name_by_subject(s.heartbeat("w1"))


async def test_kv_bucket_returns_existing(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    kv = await kv_bucket(js, s, "workers")
    await kv.put("w1", b"x")
    again = await kv_bucket(js, s, "workers")
    assert (await again.get("w1")).value == b"x"

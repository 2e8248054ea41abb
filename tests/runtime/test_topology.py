"""Streams and KV buckets against a real nats-server: created idempotently, namespaced."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings
from swarm_runtime.topology import (
    BUCKETS,
    DAY,
    MAX_MSG_SIZE,
    ensure_topology,
    kv_bucket,
    stream_configs,
)


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

    names = [c.name for c in stream_configs(s)]
    assert len(set(names)) == len(names)  # no stream is declared twice
    for name in names:  # each exists once on the server
        assert (await js.stream_info(name)).config.name == name
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
    assert not first.duplicate
    assert again.duplicate
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


async def test_tinker_futures_expire_after_a_day(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await kv_bucket(js, s, "tinker_futures")
    info = await js.stream_info(f"KV_{s.bucket('tinker_futures')}")
    assert info.config.max_age == 24 * 3600
    await kv_bucket(js, s, "tinker_models")  # state, not a result: kept
    kept = await js.stream_info(f"KV_{s.bucket('tinker_models')}")
    assert not kept.config.max_age


async def test_the_consumer_filters_docs_events_md_gives_work(
    js: JetStreamContext, namespace: str
) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s)
    await js.publish(s.job_event("job-1", "queued"), b"{}")
    await js.publish(s.sweep_event("sw-1", "created"), b"{}")
    # One job's events, every job's, one sweep's: each with an ordered consumer (deliver all).
    for documented, subject in [
        (s.job_event("job-1", "*"), s.job_event("job-1", "queued")),
        (s.job_event("*", "*"), s.job_event("job-1", "queued")),
        (s.sweep_event("sw-1", "*"), s.sweep_event("sw-1", "created")),
    ]:
        sub = await js.subscribe(documented, ordered_consumer=True)
        assert (await sub.next_msg(timeout=5)).subject == subject
        await sub.unsubscribe()


async def test_limits_are_explicit(js: JetStreamContext, namespace: str) -> None:
    s = Subjects(namespace)
    await ensure_topology(js, s, replicas=1)
    for config in stream_configs(s):
        info = await js.stream_info(config.name)
        assert info.config.num_replicas == 1
        assert info.config.max_msg_size == MAX_MSG_SIZE
        assert info.config.max_age
        assert info.config.max_age > 0
    kv = await js.key_value(s.bucket("jobs"))
    assert (await kv.status()).history == 1


def test_replicas_apply_to_every_stream() -> None:
    # A 3-node cluster (SWARM_JS_REPLICAS=3): every stream is made with three replicas.
    configs = stream_configs(Subjects("x"), replicas=3)
    assert configs
    assert all(c.num_replicas == 3 for c in configs)

"""JetStream streams and KV buckets, created (or updated) idempotently at every service start.

Limits are explicit, and the same on one server and on a cluster: file storage, ``replicas``
(``SWARM_JS_REPLICAS``: 3 on a 3-node cluster), a maximum age per stream with the oldest
messages discarded first, de-duplication windows, and messages no larger than the server's
``max_payload`` (8 MB in deploy/nats). KV buckets keep one revision per key (compare-and-set
needs no more) and never expire. docs/reliability.md lists them with what each one guards.
"""

from __future__ import annotations

from dataclasses import replace

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from swarm_contracts.subjects import Subjects

DAY = 24 * 3600
BUCKETS = (
    "jobs",
    "workers",
    "worker_ops",
    "datasets",
    "models",
    "adapters",
    "leader",
    "sweeps",
    "trials",
    "session_leases",
)

# Buckets read with direct gets (``$JS.API.DIRECT.GET.<stream>.<subject>``): the key is in the
# API subject, so a NATS user can be allowed single records by key and nothing else (a
# provider's agent reads the records of its own jobs: swarm_contracts.providers).
DIRECT_BUCKETS = frozenset({"jobs"})
# Buckets whose entries expire: a Tinker call's future is fetched within minutes of the call
# (a reconnecting client too); kept a day, then gone rather than kept for ever.
BUCKET_TTL_S = {"tinker_futures": 24 * 3600.0}

MAX_MSG_SIZE = 8 * 1024 * 1024


def _stream(
    name: str,
    subject: str | list[str],
    max_age_days: int,
    duplicate_window: float = 120,
) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=[subject] if isinstance(subject, str) else subject,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        duplicate_window=duplicate_window,
        max_age=max_age_days * DAY,
        max_msg_size=MAX_MSG_SIZE,
    )


def stream_configs(s: Subjects, replicas: int = 1) -> list[StreamConfig]:
    return [replace(config, num_replicas=replicas) for config in _streams(s)]


def _streams(s: Subjects) -> list[StreamConfig]:
    return [
        # Submissions: Nats-Msg-Id de-duplication over a day; the job id derived from the
        # idempotency key makes duplicates harmless after that too.
        _stream(s.submit_stream, s.submit, 7, duplicate_window=DAY),
        # Every job event, kept so that anyone can replay a job's history.
        _stream(s.events_stream, s.job_event(), 30, duplicate_window=600),
        # Workers' events as they sent them (swarm.workers.<id>.events.<job>.<event>): only
        # the scheduler reads them, and publishes those it accepts on the events stream.
        # Kept a day: what matters of them is in the records and the events stream by then.
        _stream(s.worker_events_stream, s.worker_event(), 1, duplicate_window=600),
        _stream(s.control_stream, [s.cancel(), s.verify(), s.pause(), s.resume()], 7),
        _stream(s.assign_stream, s.assign(), 7, duplicate_window=600),
        _stream(
            s.adapters_stream,
            [s.adapter_registered(), s.adapter_promoted()],
            365,
            duplicate_window=600,
        ),
        # Sweeps: submissions (de-duplicated like jobs') and cancellations; their events,
        # de-duplicated over a day so that a restarted controller that announces a step again
        # stores it once.
        _stream(s.sweeps_stream, [s.sweep_submit, s.sweep_cancel()], 7, duplicate_window=DAY),
        _stream(s.sweep_events_stream, s.sweep_event(), 30, duplicate_window=DAY),
        _stream(s.dead_letter_stream, s.dead_letter(), 30),
    ]


async def ensure_topology(js: JetStreamContext, s: Subjects, replicas: int = 1) -> None:
    for config in stream_configs(s, replicas):
        try:
            await js.stream_info(config.name or "")
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)
    for name in BUCKETS:
        await kv_bucket(js, s, name, replicas)
    for name in DIRECT_BUCKETS:
        # Buckets made before direct gets were wanted get them now.
        info = await js.stream_info(f"KV_{s.bucket(name)}")
        if not info.config.allow_direct:
            await js.update_stream(replace(info.config, allow_direct=True))


async def kv_bucket(js: JetStreamContext, s: Subjects, name: str, replicas: int = 1) -> KeyValue:
    bucket = s.bucket(name)
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        # history=1 is enough: the revision number alone drives compare-and-set.
        return await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
                max_value_size=MAX_MSG_SIZE,
                direct=name in DIRECT_BUCKETS,
                ttl=BUCKET_TTL_S.get(name),
            )
        )

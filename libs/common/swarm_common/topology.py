"""JetStream streams and KV buckets, created (or updated) idempotently at every service start."""

from __future__ import annotations

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

from swarm_common.subjects import Subjects

DAY = 24 * 3600
BUCKETS = ("jobs", "workers", "datasets", "models", "adapters", "leader")


def _stream(
    name: str, subject: str | list[str], max_age_days: int, duplicate_window: float = 120
) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=[subject] if isinstance(subject, str) else subject,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        duplicate_window=duplicate_window,
        max_age=max_age_days * DAY,
    )


def stream_configs(s: Subjects) -> list[StreamConfig]:
    return [
        # Submissions: Nats-Msg-Id de-duplication over a day; the job id derived from the
        # idempotency key makes duplicates harmless after that too.
        _stream(s.submit_stream, s.submit, 7, duplicate_window=DAY),
        # Every job event, kept so that anyone can replay a job's history.
        _stream(s.events_stream, s.job_event(), 30, duplicate_window=600),
        _stream(s.control_stream, s.cancel(), 7),
        _stream(s.assign_stream, s.assign(), 7, duplicate_window=600),
        _stream(
            s.adapters_stream,
            [s.adapter_registered(), s.adapter_promoted()],
            365,
            duplicate_window=600,
        ),
        _stream(s.dead_letter_stream, s.dead_letter(), 30),
    ]


async def ensure_topology(js: JetStreamContext, s: Subjects) -> None:
    for config in stream_configs(s):
        try:
            await js.stream_info(config.name)
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)
    for name in BUCKETS:
        await kv_bucket(js, s, name)


async def kv_bucket(js: JetStreamContext, s: Subjects, name: str) -> KeyValue:
    bucket = s.bucket(name)
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        # history=1 is enough: the revision number alone drives compare-and-set.
        return await js.create_key_value(
            KeyValueConfig(bucket=bucket, history=1, storage=StorageType.FILE)
        )

"""The one place that reads private attributes of nats-py.

nats-py's ``KeyValue`` keeps its JetStream context, stream name and subject prefix private
(``_js``, ``_stream``, ``_pre``), and has no public way to list keys that ends exactly
(``RecordTable.keys`` says why its own ``keys()`` is not used). Listing them ourselves needs
those three; they are read here and nowhere else, and tests/runtime/test_nats_private.py pins
what they must be, so that a nats-py upgrade that renames them fails that test, not a service.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue


@dataclass(frozen=True)
class BucketStream:
    """Where a KV bucket's entries live: its JetStream context, stream and subject prefix
    (``$KV.<bucket>.``; a key's subject is the prefix plus the key)."""

    js: JetStreamContext
    stream: str
    prefix: str


def bucket_stream(kv: KeyValue) -> BucketStream:
    return BucketStream(js=kv._js, stream=kv._stream, prefix=kv._pre)

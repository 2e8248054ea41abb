"""A store that does not answer: how a failed call is told from an answer, and the S3
client's patience with a restart or a network blip."""

from __future__ import annotations

import os
from typing import Any

# Connection attempts of one store call before it fails (see outage_tolerant_http).
OUTAGE_RETRIES = 12

# What a store call that could not reach the store says, in the exception chain or, from a Ray
# worker (whose exceptions may reach the agent as text), in the message.
_UNREACHABLE_TEXT = (
    "Failed to establish a new connection",
    "Max retries exceeded",
    "Connection refused",
    "Couldn't connect to server",  # pyarrow's S3 filesystem (Ray's checkpoint writes)
)


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the store not answering, rather than an answer."""
    import urllib3.exceptions

    seen: BaseException | None = exc
    for _ in range(20):  # a cause chain is short; a cycle must not hang us
        if seen is None:
            return False
        if isinstance(seen, urllib3.exceptions.MaxRetryError | ConnectionError):
            return True
        if any(text in str(seen) for text in _UNREACHABLE_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def outage_tolerant_http() -> Any:
    """minio's own HTTP client, but retrying a refused or dropped connection for about 40 s.

    minio's default gives up after about 3 s, so a store restart or a network blip as an
    attempt starts (fetching its inputs, copying its resume checkpoint) failed the job; now
    the call waits the outage out. An answer from the store (404, 403) is not retried.
    """
    import certifi
    import urllib3
    from urllib3.util import Retry, Timeout

    return urllib3.PoolManager(
        timeout=Timeout(connect=10, read=300),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=Retry(
            total=None,
            connect=OUTAGE_RETRIES,
            read=2,
            status=5,
            other=2,
            # No wait, then 1, 2, 4, 4, ... s: about 40 s in all.
            backoff_factor=0.5,
            backoff_max=4,
            status_forcelist=(500, 502, 503, 504),
        ),
    )

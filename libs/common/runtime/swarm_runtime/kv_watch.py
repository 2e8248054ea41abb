"""A watch of a whole KV bucket whose first pass (every key's latest entry) is read complete.

nats.py's watcher marks the end of its first pass with a ``None`` entry, put in the queue when
the server reports nothing pending and the client has counted nothing delivered. On a loaded
machine the server has then sent the pass but the client has not read it yet, and the marker
comes first: a reader that stops there starts with an empty or partial view (CI saw the
gateway's jobs listing empty over a full bucket). So the pass is read up to the entry that
reaches the stream's last sequence as of the start (or the one with nothing pending after it);
the marker ends it only where the bucket has no messages left.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from nats.js.kv import KeyValue

from swarm_runtime.nats_private import bucket_stream

# How long the first pass may go without an entry before the watch counts as broken.
FIRST_PASS_TIMEOUT_S = 30.0
# How long stopping a watch may take (NATS going away under it must not hold anything up).
STOP_S = 5.0


@dataclass
class FirstPass:
    """The watch, and what it had delivered once its first pass ended: the entries (deletes
    included) and the highest stream sequence they cover."""

    watcher: KeyValue.KeyWatcher
    entries: list[KeyValue.Entry]
    revision: int


async def watch_bucket(kv: KeyValue) -> FirstPass:
    """Watch every key of ``kv``; return once the first pass has been read whole. The watcher
    then yields the changes after it (and maybe nats.py's late ``None`` marker: skip it)."""
    bucket = bucket_stream(kv)
    state = (await bucket.js.stream_info(bucket.stream)).state
    watcher = await kv.watchall()
    entries: list[KeyValue.Entry] = []
    revision = state.last_seq
    pending = bool(state.messages)
    try:
        while pending:
            entry = await watcher.updates(timeout=FIRST_PASS_TIMEOUT_S)
            if entry is None:
                # Every message of the bucket gone since (an expiry): nothing more will come.
                pending = bool((await bucket.js.stream_info(bucket.stream)).state.messages)
                continue
            entries.append(entry)
            revision = max(revision, entry.revision or 0)
            pending = (entry.revision or 0) < state.last_seq and entry.delta != 0
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(watcher.stop(), STOP_S)
        raise
    return FirstPass(watcher, entries, revision)

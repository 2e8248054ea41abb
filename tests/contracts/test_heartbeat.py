"""A heartbeat's lists are bounded: a sender cannot make the scheduler walk an unbounded one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from swarm_contracts.sessions import HeldSession
from swarm_contracts.workers import SESSIONS_LISTED_MAX, Heartbeat, Resources


def heartbeat(sessions: int) -> Heartbeat:
    res = Resources(cpus=1, memory_bytes=1 << 30)
    listed = [HeldSession(session=f"tsess-{i:016x}-train-0", attempt=1) for i in range(sessions)]
    return Heartbeat(worker_id="w1", resources=res, free=res, sessions=listed)


def test_a_heartbeat_lists_at_most_so_many_sessions() -> None:
    assert len(heartbeat(SESSIONS_LISTED_MAX).sessions) == SESSIONS_LISTED_MAX
    with pytest.raises(ValidationError, match="sessions"):
        heartbeat(SESSIONS_LISTED_MAX + 1)

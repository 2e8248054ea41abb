"""Training sessions' leases (swarm_scheduler.session_leases) against a real scheduler, registry
and nats-server: a session takes room like a job, waits for it like one, counts in its tenant's
running work, lives as long as its worker lists it, and each placement is a new attempt that
fences the previous worker."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from swarm_contracts.jobs import JobState, ModelRef, job_id_for
from swarm_contracts.sessions import (
    PLACE_SESSION,
    RELEASE_SESSION,
    HeldSession,
    PlaceSession,
    ReleaseSession,
    SessionLease,
)
from swarm_contracts.workers import ATTEMPT, AttemptQuery, Gpu
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused, ServiceClient
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket
from swarm_scheduler.session_leases import WAITING_FORGOTTEN_S

from .conftest import Harness, running_harness

BASE = ModelRef(name="tiny", version=1, store_key="models/tiny/x", digest="d" * 16)


def token() -> str:
    return f"tsess-{uuid.uuid4().hex[:16]}-train-0"


def scheduler(h: Harness) -> ServiceClient:
    return ServiceClient(h.nc, "scheduler", h.subjects.scheduler)


async def place(
    h: Harness, session: str, tenant: str = "a", avoid: str | None = None
) -> SessionLease:
    request = PlaceSession(session=session, tenant=tenant, base_model=BASE, avoid=avoid)
    lease: SessionLease = await scheduler(h).call(PLACE_SESSION, request)
    return lease


async def holds(h: Harness, worker_id: str, session: str, attempt: int) -> bool:
    """What a worker hears when it asks, before a save, whether the attempt is still its own."""
    asker = ServiceClient(h.nc, "scheduler", lambda _: h.subjects.worker_attempt(worker_id))
    return (await asker.call(ATTEMPT, AttemptQuery(job_id=session, attempt=attempt))).holds


async def leases(h: Harness) -> RecordTable[SessionLease]:
    return RecordTable(await kv_bucket(h.js, h.subjects, "session_leases"), SessionLease)


async def wait_lease(h: Harness, session: str, pred: object, timeout: float = 10.0) -> SessionLease:
    table = await leases(h)
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        found = await table.get(session)
        last = found[0] if found else None
        if last is not None and pred(last):  # type: ignore[operator]
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"the lease of {session} never matched; last: {last}")


async def test_a_session_takes_its_worker_s_lane_and_jobs_fit_around_it(harness: Harness) -> None:
    h = harness
    first, second = token(), token()
    listed = [HeldSession(session=first, attempt=1), HeldSession(session=second, attempt=1)]
    async with h.beating("w1", cpus=2, sessions=listed):
        await asyncio.sleep(0.3)
        lease = await place(h, first)
        assert (lease.worker_id, lease.attempt, lease.cpus, lease.gpus) == ("w1", 1, 1, 0)
        assert lease.state == "held"
        # A second session shares the lane: the worker's other CPU is still a job's.
        assert (await place(h, second)).worker_id == "w1"
        await h.submit(h.spec(resources={"cpus_per_worker": 2}), msg_id="big")
        await h.submit(h.spec(), msg_id="small")
        big, small = job_id_for("default", "big"), job_id_for("default", "small")
        await h.wait_record(small, lambda r: r.state == JobState.assigned)
        waiting = await h.wait_record(big, lambda r: r.reason is not None)
        assert waiting.state == JobState.queued
        assert waiting.reason == "waiting for 2 CPUs to free up on a worker"
        # Placing the same session again (a retried request) answers the lease it has.
        assert (await place(h, first)).attempt == 1


async def test_a_released_lane_frees_the_room_for_a_job(harness: Harness) -> None:
    h = harness
    session = token()
    async with h.beating("w1", cpus=2, sessions=[HeldSession(session=session, attempt=1)]):
        await asyncio.sleep(0.3)
        await place(h, session)
        await h.submit(h.spec(resources={"cpus_per_worker": 2}), msg_id="big")
        big = job_id_for("default", "big")
        await h.wait_record(big, lambda r: r.reason is not None)
        ended = await scheduler(h).call(RELEASE_SESSION, ReleaseSession(session=session, attempt=1))
        assert (ended.state, ended.reason) == ("ended", "closed")
        record = await h.wait_record(big, lambda r: r.state == JobState.assigned)
        assert record.worker_id == "w1"
        assert await (await leases(h)).get(session) is None  # a closed session leaves nothing


async def test_a_session_waits_for_room_and_says_why(harness: Harness) -> None:
    h = harness
    with pytest.raises(Refused) as none:
        await place(h, token())
    assert none.value.code == "conflict"
    assert none.value.message == (
        "waiting for a worker of the cluster's own (providers' workers take no training "
        "sessions here)"
    )
    # A provider's worker has no store keys to give a session.
    async with h.beating("acme", cpus=4, labels={"provider": "acme"}):
        await asyncio.sleep(0.3)
        with pytest.raises(Refused, match="cluster's own"):
            await place(h, token())
    # Those two are not asked for again (their clients gave up): forgotten, they take no room
    # from the worker that comes next (asked for, the scheduler would lease them room there).
    await asyncio.sleep(WAITING_FORGOTTEN_S + 0.5)
    async with h.beating("w1", cpus=1):
        await h.submit(h.spec(), msg_id="job")
        await h.wait_record(job_id_for("default", "job"), lambda r: r.state == JobState.assigned)
        with pytest.raises(Refused) as full:
            await place(h, token())
        assert full.value.message == "waiting for 1 CPU to free up on a worker for the session"


async def test_a_gpu_worker_s_lane_takes_a_gpu(harness: Harness) -> None:
    h = harness
    gpu = [Gpu(index=0, name="L4", memory_bytes=24 << 30)]
    async with h.beating("g1", cpus=4, gpus=gpu):
        await asyncio.sleep(0.3)
        lease = await place(h, token())
        assert (lease.worker_id, lease.cpus, lease.gpus) == ("g1", 1, 1)
        resources = {"gpus_per_worker": 1}
        await h.submit(h.spec(resources=resources), msg_id="gpu-job")
        waiting = await h.wait_record(job_id_for("default", "gpu-job"), lambda r: r.reason)
        assert waiting.reason == "waiting for 1 CPU, 1 GPU to free up on a worker"


async def waiting_behind_a_job(h: Harness) -> tuple[str, str, str]:
    """On a 1-CPU worker: job ``first`` holds the CPU, a session asks (refused: it waits from
    now), then job ``second`` is queued behind it. The session and both job ids."""
    await asyncio.sleep(0.3)
    await h.submit(h.spec(), msg_id="first")
    first = job_id_for("default", "first")
    await h.wait_record(first, lambda r: r.state == JobState.assigned)
    session = token()
    with pytest.raises(Refused):
        await place(h, session, tenant="default")
    await h.submit(h.spec(), msg_id="second")
    second = job_id_for("default", "second")
    await h.wait_record(second, lambda r: r.state == JobState.queued)
    return session, first, second


async def test_a_waiting_session_takes_freed_room_before_a_job_queued_after_it(
    settings: Settings, tmp_path: Path
) -> None:
    """Fair order, not a race: the room a job frees goes to the session that has waited
    longer than the next queued job, leased by the scheduler's own pass (the gateway, which
    asks every second, finds the lease), not to whichever asks first. (A quick cancel: the
    session's last ask must be under 3 s old when the room frees, as a gateway's always is.)"""
    quick = running_harness(settings, tmp_path, cancel_grace_s=0.5)
    async with quick as h, h.beating("w1", cpus=1):
        session, first, second = await waiting_behind_a_job(h)
        with pytest.raises(Refused):
            await place(h, session, tenant="default")  # still asking, as a gateway does
        await h.cancel(first)
        lease = await wait_lease(h, session, lambda lease: lease.state == "held")
        assert (lease.worker_id, lease.attempt) == ("w1", 1)
        await asyncio.sleep(1.5)  # placement passes: the job stays behind the session
        found = await h.wait_record(second, lambda r: r.reason is not None)
        assert found.state == JobState.queued
        assert await place(h, session, tenant="default") == lease  # the gateway's next ask
        await asyncio.sleep(WAITING_FORGOTTEN_S + 1)
        kept = await (await leases(h)).get(session)
        assert kept is not None
        assert kept[0].state == "held"  # taken by its gateway: it stays


async def test_an_adopted_wait_keeps_its_place_in_the_fair_order(
    settings: Settings, tmp_path: Path
) -> None:
    """A gateway that adopts a dead gateway's wait asks with the model's first ask's time: its
    first ask here comes after job ``second`` was queued, yet the model stands ahead of it."""
    quick = running_harness(settings, tmp_path, cancel_grace_s=0.5)
    async with quick as h, h.beating("w1", cpus=1):
        await asyncio.sleep(0.3)
        await h.submit(h.spec(), msg_id="first")
        first = job_id_for("default", "first")
        await h.wait_record(first, lambda r: r.state == JobState.assigned)
        await h.submit(h.spec(), msg_id="second")
        second = job_id_for("default", "second")
        await h.wait_record(second, lambda r: r.state == JobState.queued)
        session = token()
        since = datetime.now(UTC) - timedelta(minutes=5)
        request = PlaceSession(
            session=session, tenant="default", base_model=BASE, waiting_since=since
        )
        with pytest.raises(Refused):
            await scheduler(h).call(PLACE_SESSION, request)
        await h.cancel(first)
        lease = await wait_lease(h, session, lambda lease: lease.state == "held")
        assert lease.worker_id == "w1"
        found = await h.wait_record(second, lambda r: r.reason is not None)
        assert found.state == JobState.queued


async def test_room_leased_to_a_waiting_session_its_gateway_never_takes_is_freed(
    settings: Settings, tmp_path: Path
) -> None:
    quick = running_harness(settings, tmp_path, cancel_grace_s=0.5)
    async with quick as h, h.beating("w1", cpus=1):
        session, first, second = await waiting_behind_a_job(h)
        await h.cancel(first)
        await wait_lease(h, session, lambda lease: lease.state == "held")
        # Its client left while it waited: nobody asks for it again.
        ended = await wait_lease(h, session, lambda lease: lease.state == "ended")
        assert ended.reason == "leased while it waited, but its gateway did not take it"
        assert (
            await h.wait_record(second, lambda r: r.state == JobState.assigned)
        ).worker_id == "w1"


async def test_sessions_count_against_the_tenant_limit(settings: Settings, tmp_path: Path) -> None:
    limited = running_harness(settings, tmp_path, tenant_max_running=1)
    async with limited as h, h.beating("w1", cpus=4):
        await asyncio.sleep(0.3)
        await place(h, token(), tenant="a")
        with pytest.raises(Refused) as limit:
            await place(h, token(), tenant="a")
        assert limit.value.message == (
            "tenant a is at its limit of 1 running job (its training sessions count)"
        )
        await place(h, token(), tenant="b")  # another tenant's is not held back
        await h.submit(h.spec(), msg_id="a-job", tenant="a")
        waiting = await h.wait_record(job_id_for("a", "a-job"), lambda r: r.reason)
        assert waiting.reason == "tenant a is at its limit of 1 running job"


async def test_providers_take_sessions_where_the_cluster_allows_with_the_tokens_digest(
    settings: Settings, tmp_path: Path
) -> None:
    """``sessions_on_providers``: a provider's worker gets the session; the lease keeps what
    the registry grants store access by (the base model, the digest of the gateway's token);
    a retried request (its reply lost) gets the same lease, with the new request's token."""
    opened = running_harness(settings, tmp_path, sessions_on_providers=True)
    async with opened as h, h.beating("acme-1", cpus=2, labels={"provider": "acme"}):
        await asyncio.sleep(0.3)
        session = token()
        first = PlaceSession(
            session=session, tenant="a", base_model=BASE, attempt_token_sha256="1" * 64
        )
        lease: SessionLease = await scheduler(h).call(PLACE_SESSION, first)
        assert (lease.worker_id, lease.base_model, lease.attempt) == ("acme-1", BASE, 1)
        assert lease.attempt_token_sha256 == "1" * 64
        again = first.model_copy(update={"attempt_token_sha256": "2" * 64})
        retried: SessionLease = await scheduler(h).call(PLACE_SESSION, again)
        assert (retried.worker_id, retried.attempt) == ("acme-1", 1)
        stored = await (await leases(h)).get(session)
        assert stored is not None
        assert stored[0].attempt_token_sha256 == "2" * 64


async def test_a_lease_its_worker_stops_listing_ends_and_the_next_is_a_new_attempt(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, assign_timeout_s=1.0) as h:
        session = token()
        async with h.beating("w1", cpus=2, sessions=[HeldSession(session=session, attempt=1)]):
            await asyncio.sleep(0.3)
            await place(h, session)
            await asyncio.sleep(1.5)  # listed: renewed past the timeout
            assert await holds(h, "w1", session, 1)
            assert not await holds(h, "w2", session, 1)  # only the holder
        async with h.beating("w1", cpus=2):  # alive, but no longer listing it
            ended = await wait_lease(h, session, lambda lease: lease.state == "ended")
            assert ended.reason == "worker w1 has not listed the session for 1s"
            assert not await holds(h, "w1", session, 1)
            again = await place(h, session)
            assert (again.worker_id, again.attempt) == ("w1", 2)


async def test_moving_off_a_lost_worker_fences_it(harness: Harness) -> None:
    h = harness
    session = token()
    held = [HeldSession(session=session, attempt=1)]
    async with h.beating("w1", cpus=2, sessions=held), h.beating("w2", cpus=2):
        await asyncio.sleep(0.3)
        first = await place(h, session)
        other = "w2" if first.worker_id == "w1" else "w1"
        moved = await place(h, session, avoid=first.worker_id)
        assert (moved.worker_id, moved.attempt) == (other, 2)
        assert not await holds(h, first.worker_id, session, 1)  # its saves are refused
        assert await holds(h, other, session, 2)


async def test_a_lost_worker_s_leases_end(harness: Harness) -> None:
    h = harness
    session = token()
    async with h.beating("w1", cpus=2, sessions=[HeldSession(session=session, attempt=1)]):
        await asyncio.sleep(0.3)
        await place(h, session)
    ended = await wait_lease(h, session, lambda lease: lease.state == "ended")
    assert ended.reason == "worker w1 was lost"

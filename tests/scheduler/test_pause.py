"""Pause and resume: the state machine as pure functions, then against a real scheduler and
registry on a real nats-server, with the worker played by the test through the wire contract
(heartbeats, hand-backs), so that it can decide when, and whether, to hand a job back."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from swarm_contracts.events import Cancelled, Paused, Released, Started
from swarm_contracts.jobs import JobRecord, JobState, job_id_for, unpausable, unresumable, utcnow
from swarm_contracts.replies import Reply
from swarm_contracts.verification import VerifyTarget
from swarm_contracts.workers import AttemptQuery, AttemptStatus, RunningJob
from swarm_runtime.settings import Settings
from swarm_scheduler.leases import LeaseClock, Overdue, overdue
from swarm_scheduler.transitions import taken_back

from .conftest import Harness, running_harness
from .test_placement import job

NOW = utcnow()


def held(state: JobState = JobState.running, worker: str = "w1") -> JobRecord:
    r = job("job-1")
    r.state, r.worker_id, r.attempt, r.assigned_at = state, worker, 1, NOW
    return r


def take_back(r: JobRecord, handback: bool = True, max_attempts: int = 3) -> JobRecord | None:
    return taken_back(
        r,
        worker_id="w1",
        reason="handed back",
        cancel=False,
        handback=handback,
        max_attempts=max_attempts,
    )


# --- the state machine, pure ---------------------------------------------------------------


def test_a_hand_back_of_a_job_being_paused_pauses_it_and_frees_the_worker() -> None:
    r = held()
    r.pause_requested, r.pause_requested_at = True, NOW
    r.metrics["step"] = 7
    new = take_back(r)
    assert new is not None
    assert new.state == JobState.paused
    assert (new.worker_id, new.assigned_at, new.pause_requested, new.pause_requested_at) == (
        None,
        None,
        False,
        None,
    )
    assert new.faults == 0  # a hand-back on request failed nothing
    assert "step" not in new.metrics
    assert new.reason == "paused: handed back"


def test_a_job_being_paused_whose_worker_is_lost_is_paused_with_the_fault_counted() -> None:
    r = held()
    r.pause_requested = True
    new = take_back(r, handback=False, max_attempts=1)
    assert new is not None
    # Paused, not failed: the user asked for it to wait, and a resume gives it a new attempt.
    assert (new.state, new.faults) == (JobState.paused, 1)


def test_a_cancel_wins_over_a_pause() -> None:
    r = held()
    r.pause_requested, r.cancel_requested = True, True
    new = take_back(r)
    assert new is not None
    assert new.state == JobState.cancelled
    assert new.worker_id == "w1"  # a finished record keeps who ran it


def test_without_a_pause_a_hand_back_queues_the_job_again() -> None:
    new = take_back(held())
    assert new is not None
    assert (new.state, new.worker_id) == (JobState.queued, None)


def test_a_worker_that_does_not_hold_the_job_takes_nothing_back() -> None:
    assert take_back(held(worker="w2")) is None
    paused = held()
    paused.state, paused.worker_id = JobState.paused, None
    assert take_back(paused) is None


def test_what_may_be_paused_and_resumed() -> None:
    running = held()
    assert unpausable(running) is None
    assert unpausable(held(JobState.assigned)) is None
    assert "queued, not running" in (unpausable(held(JobState.queued)) or "")
    assert "already paused" in (unpausable(held(JobState.paused)) or "")
    assert "nothing to pause" in (unpausable(held(JobState.succeeded)) or "")
    cancelling = held()
    cancelling.cancel_requested = True
    assert "being cancelled" in (unpausable(cancelling) or "")
    replay = held()
    replay.verify = VerifyTarget(job_id="job-0", attempt=1, worker_id="w0", from_step=2, to_step=4)
    assert "replay cannot be paused" in (unpausable(replay) or "")
    assert unresumable(held(JobState.paused)) is None
    assert "not paused" in (unresumable(running) or "")
    pausing = held()
    pausing.pause_requested = True
    assert "still being paused" in (unresumable(pausing) or "")


def test_a_pause_the_worker_does_not_answer_is_taken_back_after_the_grace() -> None:
    r = held()
    r.pause_requested, r.pause_requested_at = True, NOW

    def due(after_s: float) -> list[Overdue]:
        clock = LeaseClock(NOW + timedelta(seconds=after_s), after_s, 60.0, 2.0, 30.0)
        return overdue(
            [r],
            clock,
            alive=lambda w: True,
            trust_absence=lambda w: True,
            last_listed=lambda rec: after_s,
        )

    assert due(29) == []
    assert due(31) == [
        Overdue("job-1", "w1", "requeue", "worker w1 did not hand it back within 30s")
    ]


# --- against a real scheduler ----------------------------------------------------------------


def holding(worker_id: str, attempt: int) -> object:
    return lambda r: (
        r.worker_id == worker_id and r.attempt == attempt and r.state == JobState.assigned
    )


async def attempt_status(h: Harness, worker_id: str, job_id: str, attempt: int) -> AttemptStatus:
    query = AttemptQuery(job_id=job_id, attempt=attempt)
    reply = await h.nc.request(
        h.subjects.worker_attempt(worker_id), query.model_dump_json().encode(), timeout=5
    )
    answer = Reply[AttemptStatus].model_validate_json(reply.data)
    assert answer.result is not None, answer
    return answer.result


async def test_a_paused_job_frees_its_worker_until_it_is_resumed(harness: Harness) -> None:
    h = harness
    first, second = job_id_for("default", "first"), job_id_for("default", "second")
    listed: list[RunningJob] = []
    release = await h.nc.subscribe(h.subjects.release("w1"))
    # One CPU: the worker holds one job at a time.
    async with h.beating("w1", running=lambda: listed, cpus=1):
        await h.submit(h.spec(), msg_id="first")
        await h.wait_record(first, holding("w1", 1))
        await h.emit(Started(job_id=first, attempt=1, worker_id="w1"))
        listed.append(RunningJob(job_id=first, attempt=1, step=5))
        await h.wait_record(first, lambda r: r.state == JobState.running)
        await h.submit(h.spec(), msg_id="second")
        waiting = await h.wait_record(second, lambda r: r.reason is not None)
        assert waiting.state == JobState.queued  # no room beside the first

        await h.control("pause", first)
        # The worker is asked to checkpoint and hand it back, and so is an agent that missed
        # the request and asks about its attempt.
        msg = await release.next_msg(timeout=10)
        asked = json.loads(msg.data)["data"]
        assert asked == {"worker_id": "w1", "job_ids": [first], "reason": "paused by request"}
        pausing = await h.wait_record(first, lambda r: r.pause_requested)
        assert pausing.state == JobState.running  # until the worker has handed it back
        status = await attempt_status(h, "w1", first, 1)
        assert (status.holds, status.release_requested) == (True, True)

        listed.clear()
        await h.emit(
            Released(
                job_id=first,
                attempt=1,
                worker_id="w1",
                reason="paused by request",
                last_checkpoint_step=5,
            )
        )
        paused = await h.wait_record(first, lambda r: r.state == JobState.paused)
        assert (paused.worker_id, paused.faults, paused.pause_requested) == (None, 0, False)
        assert "checkpoint at step 5" in (paused.reason or "")
        # Nothing held: the second job gets the worker.
        await h.wait_record(second, holding("w1", 1))
        assert not (await attempt_status(h, "w1", first, 1)).holds

        # Resumed: queued again, and placed once there is room, with the next attempt.
        await h.control("resume", first)
        resumed = await h.wait_record(first, lambda r: r.state == JobState.queued)
        assert resumed.attempt == 1
        await h.cancel(second)
        await h.wait_record(second, lambda r: r.cancel_requested)
        await h.emit(Cancelled(job_id=second, attempt=1))
        await h.wait_record(first, holding("w1", 2))

    events = [(e["data"]["event"], e["data"]["attempt"]) for e in await h.events(first)]
    assert events == [
        ("queued", 0),
        ("assigned", 1),
        ("started", 1),
        ("released", 1),
        ("paused", 1),
        ("resumed", 1),
        ("assigned", 2),
    ]
    paused_event = next(e for e in await h.events(first) if e["data"]["event"] == "paused")
    assert paused_event["data"]["last_checkpoint_step"] == 5


async def test_a_paused_job_is_cancelled_at_once_and_resume_and_pause_change_only_their_state(
    harness: Harness,
) -> None:
    h = harness
    job_id = job_id_for("default", "k")
    # No worker: the job stays queued. A pause read while it is queued (it was running when
    # the API accepted it, and was requeued since) pauses it at once: it holds nothing.
    await h.submit(h.spec(), msg_id="k")
    await h.wait_record(job_id, lambda r: r.state == JobState.queued)
    await h.control("pause", job_id)
    paused = await h.wait_record(job_id, lambda r: r.state == JobState.paused)
    assert paused.worker_id is None
    # A worker that comes now gets nothing: a paused job is not placed.
    async with h.beating("w1", cpus=2):
        await h.control("pause", job_id)  # again: nothing changes
        await h.cancel(job_id)
        cancelled = await h.wait_record(job_id, lambda r: r.state.terminal, timeout=5)
    assert cancelled.state == JobState.cancelled
    assert cancelled.attempt == 0
    events = [e["data"]["event"] for e in await h.events(job_id)]
    assert events == ["queued", "paused", "cancelled"]

    # Resuming what is not paused changes nothing (the scheduler's own call: done when it
    # returns), nor does pausing a job that has ended.
    assert h.scheduler is not None
    await h.scheduler.resume(job_id, "resumed by request")
    await h.scheduler.pause(job_id, "paused by request")
    after = await h.wait_record(job_id, lambda r: True)
    assert (after.state, after.pause_requested) == (JobState.cancelled, False)
    assert [e["data"]["event"] for e in await h.events(job_id)] == events


@pytest.mark.parametrize("how", ["silent worker", "lost worker"])
async def test_a_job_whose_worker_never_hands_it_back_is_paused_all_the_same(
    settings: Settings, tmp_path: Path, how: str
) -> None:
    # A worker that keeps beating but ignores the request: taken back after the pause grace.
    # A worker that dies meanwhile: taken back when it is lost, and paused rather than queued.
    overrides = {"pause_grace_s": 1.5, "worker_timeout_s": 1.0, "max_attempts": 3}
    async with running_harness(settings, tmp_path, **overrides) as h:
        job_id = job_id_for("default", "k")
        listed = [RunningJob(job_id=job_id, attempt=1)]
        async with h.beating("w1", running=lambda: listed, cpus=2):
            await h.submit(h.spec(), msg_id="k")
            await h.wait_record(job_id, holding("w1", 1))
            await h.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
            await h.wait_record(job_id, lambda r: r.state == JobState.running)
            await h.control("pause", job_id)
            await h.wait_record(job_id, lambda r: r.pause_requested)
            if how == "silent worker":
                paused = await h.wait_record(job_id, lambda r: r.state == JobState.paused)
        if how == "lost worker":
            paused = await h.wait_record(job_id, lambda r: r.state == JobState.paused)
            assert "lost" in (paused.reason or "")
        else:
            assert "did not hand it back within 1.5s" in (paused.reason or "")
        assert paused.worker_id is None
        assert paused.faults == 1  # the worker failed to do what was asked


async def test_a_pause_asked_before_the_worker_started_the_job_is_still_a_pause(
    settings: Settings, tmp_path: Path
) -> None:
    """The worker gets the assignment and the pause together: it reports the hand-back of an
    attempt it never trained (no checkpoint), and the job is paused from nothing."""
    async with running_harness(settings, tmp_path) as h:
        job_id = job_id_for("default", "k")
        async with h.beating("w1", cpus=2):
            await h.submit(h.spec(), msg_id="k")
            await h.wait_record(job_id, holding("w1", 1))
            await h.control("pause", job_id)
            await h.wait_record(job_id, lambda r: r.pause_requested)
            await h.emit(
                Released(job_id=job_id, attempt=1, worker_id="w1", reason="paused by request")
            )
            paused = await h.wait_record(job_id, lambda r: r.state == JobState.paused)
        assert paused.faults == 0
        events = await h.events(job_id)
        assert events[-1]["data"]["event"] == "paused"
        assert events[-1]["data"]["last_checkpoint_step"] is None


async def test_a_worker_may_not_announce_a_pause_itself(harness: Harness) -> None:
    h = harness
    job_id = job_id_for("default", "k")
    async with h.beating("w1", cpus=2):
        await h.submit(h.spec(), msg_id="k")
        await h.wait_record(job_id, holding("w1", 1))
        await h.emit(Paused(job_id=job_id, attempt=1, reason="I feel like it"))
        await h.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
        record = await h.wait_record(job_id, lambda r: r.state == JobState.running)
    assert not record.pause_requested
    assert "paused" not in [e["data"]["event"] for e in await h.events(job_id)]


async def test_no_nats_client_can_crash_the_scheduler_with_a_pause_of_an_unknown_job(
    harness: Harness,
) -> None:
    h = harness
    await h.control("pause", "job-00000000000000000000")
    await h.control("resume", "job-00000000000000000000")
    assert await h.jobs.get("job-00000000000000000000") is None  # nothing made up
    # Serving goes on.
    await h.submit(h.spec(), msg_id="after")
    await h.wait_record(job_id_for("default", "after"), lambda r: r.state == JobState.queued)

"""The chaos run's checks (``invariants.py``) on made-up histories: each catches its violation."""

from __future__ import annotations

from typing import Any

from .invariants import Adapter, Event, check_job, percentile, recovery_s, steps_lost

JOB = "job-0123456789abcdef0123"


def ev(seq: int, name: str, attempt: int, t: float = 0.0, **data: Any) -> Event:
    return Event(seq, name, attempt, t, {"event": name, "job_id": JOB, "attempt": attempt, **data})


def progress(seq: int, attempt: int, step: int, t: float = 0.0) -> Event:
    # Figures unique to the attempt and step, as real ones are.
    loss, speed = attempt + 1 / step, 100 * attempt + step
    return ev(seq, "progress", attempt, t, step=step, max_steps=4, loss=loss, tokens_per_s=speed)


def history() -> list[Event]:
    """Attempt 1 trains 3 steps (checkpoint at 2) and is lost; attempt 2 resumes and ends."""
    return [
        ev(1, "queued", 0),
        ev(2, "assigned", 1, worker_id="t1"),
        ev(3, "started", 1, worker_id="t1", resumed_from_step=0),
        progress(4, 1, 1),
        progress(5, 1, 2),
        ev(6, "checkpoint", 1, step=2),
        progress(7, 1, 3, t=10.0),
        ev(8, "requeued", 1),
        ev(9, "assigned", 2, worker_id="t2"),
        ev(10, "started", 2, worker_id="t2", resumed_from_step=2),
        progress(11, 2, 3, t=20.0),
        progress(12, 2, 4, t=21.0),
        ev(13, "checkpoint", 2, step=4),
        ev(14, "succeeded", 2, adapter={"version": 1}),
    ]


def record(**changes: Any) -> dict[str, Any]:
    base = {
        "job_id": JOB,
        "state": "succeeded",
        "attempt": 2,
        "worker_id": "t2",
        "adapter": {"version": 1},
        "metrics": {"loss": 2.25, "tokens_per_s": 204, "checkpoint_step": 4},
    }
    return base | changes


def adapter(**changes: Any) -> Adapter:
    files = {"adapter_model.safetensors": "ab" * 32}
    base = {"version": 1, "files": files, "stored": files, "job_id": JOB, "attempt": 2}
    return Adapter(**(base | changes))


def test_a_clean_history_passes() -> None:
    assert check_job(record(), history(), [adapter()]) == []


def test_a_vanished_or_unended_job_is_caught() -> None:
    assert check_job(None, [], []) == ["vanished: no job record"]
    unended = check_job(record(state="running"), history()[:-1], [])
    assert any("not ended" in v for v in unended)
    assert any("0 terminal events" in v for v in unended)


def test_two_terminal_events_are_caught() -> None:
    late = [*history(), ev(15, "failed", 1, reason="late")]
    assert any("2 terminal events" in v for v in check_job(record(), late, [adapter()]))


def test_a_second_version_or_corrupt_files_are_caught() -> None:
    two = check_job(record(), history(), [adapter(), adapter(version=2)])
    assert any("2 adapter versions" in v for v in two)
    corrupt = adapter(stored={"adapter_model.safetensors": "cd" * 32})
    assert any("differ from their sha256" in v for v in check_job(record(), history(), [corrupt]))
    stale = check_job(record(), history(), [adapter(attempt=1)])
    assert any("registered by attempt 1" in v for v in stale)


def test_a_stale_attempt_s_event_applied_is_caught() -> None:
    # The record shows attempt 1's last figures: a stale progress event was applied.
    applied = record(metrics={"loss": 1 + 1 / 3, "tokens_per_s": 103, "checkpoint_step": 4})
    assert any("no progress of attempt 2" in v for v in check_job(applied, history(), [adapter()]))
    late = record(metrics={"loss": 2.25, "tokens_per_s": 204, "checkpoint_step": 2})
    assert any("checkpoint_step 2" in v for v in check_job(late, history(), [adapter()]))
    assert any("worker t1" in v for v in check_job(record(worker_id="t1"), history(), [adapter()]))
    # Attempt 2's step 3 applied after its step 4 (a job's events are applied concurrently).
    reordered = record(metrics={"loss": 2 + 1 / 3, "tokens_per_s": 203, "checkpoint_step": 4})
    assert check_job(reordered, history(), [adapter()]) == []


def test_gaps_and_repeats_within_an_attempt_are_caught() -> None:
    gap = [e for e in history() if e.seq != 11]  # attempt 2 never reported step 3
    assert any("attempt 2 progress steps [4]" in v for v in check_job(record(), gap, [adapter()]))


def test_ray_restarting_the_run_inside_an_attempt_repeats_the_steps_since_its_checkpoint() -> None:
    """Attempt 2 (resumed from step 2) reports steps 3 and 4, then loses a rank: Ray Train
    restarts the run from its latest checkpoint, and steps are reported again from there.
    Skipping a step, or going back before a checkpoint the attempt announced, is still caught."""

    def order_faults(*tail: Event) -> list[str]:
        events = [*(e for e in history() if e.seq <= 11), *tail]
        return [v for v in check_job(record(), events, [adapter()]) if "progress steps" in v]

    # From the resume point again (no checkpoint of its own yet), or from its checkpoint 3.
    assert order_faults(progress(20, 2, 4), progress(21, 2, 3), progress(22, 2, 4)) == []
    assert order_faults(progress(20, 2, 4), progress(21, 2, 4), progress(22, 2, 5)) == []
    # Step 4 never reported: a lost event, whatever restarted.
    assert order_faults(progress(20, 2, 5))
    # Back before the checkpoint it announced: Ray resumes from its latest.
    assert order_faults(progress(20, 2, 4), ev(21, "checkpoint", 2, step=4), progress(22, 2, 4))


def test_steps_lost_and_recovery_time() -> None:
    assert steps_lost(history()) == 1  # step 3 was trained twice
    # The fault hit at t=10 and was over at 12: attempt 2's step 3 at t=20 is the recovery.
    assert recovery_s(history(), 10.0, 12.0) == 10.0
    assert recovery_s(history(), 10.0, 30.0) is None
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile([5.0], 99) == 5.0

"""Which jobs lose their lease, as a pure function of the records and the clocks."""

from datetime import timedelta

from swarm_contracts.jobs import JobRecord, JobState, utcnow
from swarm_scheduler.leases import LeaseBook, LeaseClock, Overdue, overdue

from .test_placement import job

NOW = utcnow()


def held(job_id: str, state: JobState, worker: str = "w1", attempt: int = 1) -> JobRecord:
    r = job(job_id)
    r.state, r.worker_id, r.attempt = state, worker, attempt
    r.assigned_at = NOW
    return r


def check(records: list[JobRecord], after_s: float, listed_at: float = 0.0, **kw: object) -> list:
    clock = LeaseClock(NOW + timedelta(seconds=after_s), after_s, 10.0, 2.0)
    return overdue(
        records,
        clock,
        alive=kw.get("alive", lambda w: True),  # type: ignore[arg-type]
        trust_absence=lambda w: True,
        last_listed=lambda r: listed_at,
    )


def test_an_unconfirmed_assignment_is_requeued_after_the_timeout() -> None:
    r = held("job-1", JobState.assigned)
    assert check([r], after_s=9) == []
    assert check([r], after_s=11) == [
        Overdue("job-1", "w1", "requeue", "worker w1 did not start it within 10s")
    ]


def test_a_running_job_its_worker_stopped_listing_is_requeued() -> None:
    r = held("job-1", JobState.running)
    assert check([r], after_s=30, listed_at=25) == []
    [due] = check([r], after_s=30, listed_at=15)
    assert due.action == "requeue"
    assert "stopped listing it" in due.reason


def test_a_silent_worker_s_jobs_are_requeued() -> None:
    jobs = [held("job-1", JobState.running), held("job-2", JobState.assigned, worker="w2")]
    due = check(jobs, after_s=1, listed_at=1, alive=lambda w: w != "w1")
    assert due == [Overdue("job-1", "w1", "requeue", "worker w1 lost")]


def test_a_cancelled_job_that_never_started_is_ended_after_a_grace() -> None:
    r = held("job-1", JobState.assigned)
    r.cancel_requested, r.cancel_requested_at = True, NOW
    assert check([r], after_s=1) == []
    assert check([r], after_s=3) == [
        Overdue("job-1", "w1", "cancel", "cancelled before worker w1 started it")
    ]


def test_queued_and_finished_jobs_hold_no_lease() -> None:
    assert check([job("job-q"), held("job-s", JobState.succeeded)], after_s=1000) == []


def test_a_new_attempt_starts_with_a_lease_of_its_own() -> None:
    """What was observed of attempt 1 (running for long, listed until it was lost) says
    nothing of attempt 2: its lease counts from when attempt 2 was first seen running."""
    book = LeaseBook()
    first = held("job-1", JobState.running, attempt=1)
    book.observe([first], now=0.0)
    book.listed("job-1", 1, now=100.0)
    assert book.last_listed(first, now=101.0) == 100.0

    second = held("job-1", JobState.running, worker="w2", attempt=2)
    book.observe([second], now=200.0)
    assert book.last_listed(second, now=200.5) == 200.0  # not 0 (first seen) nor 100 (listed)
    book.listed("job-1", 1, now=201.0)  # the stale worker, woken, still lists attempt 1
    assert book.last_listed(second, now=201.5) == 200.0
    book.listed("job-1", 2, now=202.0)
    assert book.last_listed(second, now=202.5) == 202.0


def test_an_attempt_not_yet_seen_running_counts_from_now() -> None:
    book = LeaseBook()
    book.listed("job-1", 1, now=5.0)
    second = held("job-1", JobState.running, attempt=2)
    assert book.last_listed(second, now=50.0) == 50.0
    book.restart()  # a new leader counts from when it took over
    book.observe([second], now=60.0)
    assert book.last_listed(second, now=70.0) == 60.0


def test_a_cancelled_running_job_its_worker_does_not_stop_is_ended_after_the_grace() -> None:
    r = held("job-1", JobState.running)
    r.cancel_requested, r.cancel_requested_at = True, NOW
    assert check([r], after_s=1, listed_at=1) == []
    assert check([r], after_s=3, listed_at=3) == [
        Overdue("job-1", "w1", "cancel", "cancelled; worker w1 did not stop it in 2s")
    ]

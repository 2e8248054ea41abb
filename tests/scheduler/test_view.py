"""The scheduler's view of the jobs bucket, fed by hand-made watch entries (no NATS needed)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm_contracts.jobs import JobRecord, JobState
from swarm_scheduler.view import JobView

from .test_placement import job


@dataclass
class Entry:
    """What nats-py's KV watcher hands over."""

    key: str
    revision: int
    value: bytes | None
    operation: str | None = None


def entry(record: JobRecord, revision: int) -> Entry:
    return Entry(record.job_id, revision, record.model_dump_json().encode())


def view() -> JobView:
    return JobView()


def test_the_echo_of_its_own_write_is_not_parsed_again() -> None:
    s = view()
    queued = job("job-1")
    s.apply(entry(queued, 1))
    mine = queued.model_copy(update={"reason": "mine"})
    with s.writing("job-1"):
        s.apply(entry(mine, 2))  # the echo, before the write's answer
        assert s.revisions["job-1"] == 1  # held back
        s.remember(mine, 2)
    # The very object written: nothing was parsed.
    assert s.open["job-1"] is mine
    assert s.revisions["job-1"] == 2


def test_a_newer_write_by_someone_else_is_applied_after_a_failed_write() -> None:
    s = view()
    s.apply(entry(job("job-1"), 1))
    theirs = job("job-1").model_copy(update={"reason": "theirs"})
    with s.writing("job-1"):  # our compare-and-set fails: nothing to remember
        s.apply(entry(theirs, 2))
    assert (s.open["job-1"].reason, s.revisions["job-1"]) == ("theirs", 2)


def test_a_finished_job_keeps_only_its_revision_and_stale_entries_do_not_revive_it() -> None:
    closed: list[str] = []
    s = JobView(on_closed=closed.append)
    running = job("job-1")
    running.state, running.worker_id, running.attempt = JobState.running, "w1", 1
    s.apply(entry(running, 3))
    assert "job-1" in s.open
    assert s.held["w1"].cpus > 0

    done = running.model_copy(update={"state": JobState.succeeded})
    s.apply(entry(done, 4))
    assert s.revisions == {"job-1": 4}
    assert s.finished("job-1")
    assert "job-1" not in s.open
    assert "w1" not in s.held  # the capacity it held is free again
    assert closed == ["job-1"]  # the scheduler forgets its lease bookkeeping of the job

    s.apply(entry(running, 3))  # an old entry, replayed
    assert "job-1" not in s.open
    assert s.revisions == {"job-1": 4}

    s.apply(Entry("job-1", 5, None, "DEL"))
    assert s.revisions == {}
    assert "job-1" not in s.open

"""The scheduler's view of the jobs bucket, fed by hand-made watch entries (no NATS needed)."""

from __future__ import annotations

from dataclasses import dataclass

from faststream.nats import NatsBroker

from swarm_common.jobs import JobRecord, JobState
from swarm_common.settings import Settings
from swarm_scheduler.scheduler import Scheduler

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


def view() -> Scheduler:
    return Scheduler(Settings(), NatsBroker())


def test_the_echo_of_its_own_write_is_not_parsed_again() -> None:
    s = view()
    queued = job("job-1")
    s._apply_watch(entry(queued, 1))
    mine = queued.model_copy(update={"reason": "mine"})
    with s._writing_to("job-1"):
        s._apply_watch(entry(mine, 2))  # the echo, before the write's answer
        assert s.revisions["job-1"] == 1  # held back
        s._remember(mine, 2)
    # The very object written: nothing was parsed.
    assert s.open["job-1"] is mine and s.revisions["job-1"] == 2


def test_a_newer_write_by_someone_else_is_applied_after_a_failed_write() -> None:
    s = view()
    s._apply_watch(entry(job("job-1"), 1))
    theirs = job("job-1").model_copy(update={"reason": "theirs"})
    with s._writing_to("job-1"):  # our compare-and-set fails: nothing to remember
        s._apply_watch(entry(theirs, 2))
    assert (s.open["job-1"].reason, s.revisions["job-1"]) == ("theirs", 2)


def test_a_finished_job_keeps_only_its_revision_and_stale_entries_do_not_revive_it() -> None:
    s = view()
    running = job("job-1")
    running.state, running.worker_id, running.attempt = JobState.running, "w1", 1
    s._apply_watch(entry(running, 3))
    assert "job-1" in s.open and s._held["w1"].cpus > 0

    done = running.model_copy(update={"state": JobState.succeeded})
    s._apply_watch(entry(done, 4))
    assert s.revisions == {"job-1": 4} and s.finished("job-1")
    assert "job-1" not in s.open
    assert "w1" not in s._held  # the capacity it held is free again

    s._apply_watch(entry(running, 3))  # an old entry, replayed
    assert "job-1" not in s.open and s.revisions == {"job-1": 4}

    s._apply_watch(Entry("job-1", 5, None, "DEL"))
    assert s.revisions == {} and "job-1" not in s.open

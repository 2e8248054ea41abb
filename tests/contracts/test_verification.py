"""The verification contract: replay targets, the job record's checks, scopes and events."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from swarm_contracts.events import AnyJobEvent, Replayed, Verified
from swarm_contracts.jobs import JobRecord, JobSpec, JobState, replay_job_id, unverifiable
from swarm_contracts.layout import checkpoint_prefix, job_checkpoints
from swarm_contracts.store_access import job_scope
from swarm_contracts.verification import ReplayReport, Verification, VerifyTarget
from swarm_contracts.workers import WorkerOps

SPEC = JobSpec(name="a", base_model="tiny", dataset="ds-" + "0" * 16)


def target(**overrides: object) -> VerifyTarget:
    base = {"job_id": "job-aaaaaaaa", "attempt": 1, "worker_id": "w1", "from_step": 4, "to_step": 6}
    return VerifyTarget.model_validate(base | overrides)


def test_a_replay_range_runs_forward() -> None:
    assert target().steps == 2
    with pytest.raises(ValidationError):
        target(from_step=6, to_step=6)


def test_one_replay_job_per_attempt() -> None:
    first = replay_job_id("t", "job-aaaaaaaa", 1)
    assert first == replay_job_id("t", "job-aaaaaaaa", 1)
    assert first != replay_job_id("t", "job-aaaaaaaa", 2)
    assert first.startswith("job-")


def test_only_a_succeeded_job_with_two_checkpoints_can_be_verified() -> None:
    record = JobRecord(job_id="job-aaaaaaaa", tenant="t", spec=SPEC, worker_id="w1", attempt=1)
    assert "succeeded" in (unverifiable(record) or "")
    record.state = JobState.succeeded
    record.checkpoints = [6]
    assert "two committed checkpoints" in (unverifiable(record) or "")
    record.checkpoints = [4, 6]
    assert unverifiable(record) is None
    record.verify = target()
    assert "replay" in (unverifiable(record) or "")


def test_a_replay_may_read_the_checkpoints_of_the_job_it_replays() -> None:
    replay = JobRecord(job_id="job-bbbbbbbb", tenant="t", spec=SPEC, attempt=1, verify=target())
    scope = job_scope(replay, [])
    assert scope.allows("get", checkpoint_prefix("job-aaaaaaaa", 1, 6) + "/adapter.safetensors")
    assert scope.allows("list", job_checkpoints("job-aaaaaaaa") + "/")
    assert not scope.allows("put", checkpoint_prefix("job-aaaaaaaa", 1, 6) + "/x")
    plain = job_scope(replay.model_copy(update={"verify": None}), [])
    assert not plain.allows("get", checkpoint_prefix("job-aaaaaaaa", 1, 6) + "/x")


def test_a_suspect_worker_is_not_schedulable() -> None:
    assert WorkerOps(worker_id="w").schedulable
    assert not WorkerOps(worker_id="w", suspect=True).schedulable


def test_the_verification_events_parse_as_job_events() -> None:
    events = TypeAdapter(AnyJobEvent)
    report = ReplayReport(from_step=4, to_step=6, distances={"a": 0.1}, losses={5: 1.0})
    replayed = Replayed(job_id="job-bbbbbbbb", attempt=1, worker_id="w2", report=report)
    assert events.validate_json(replayed.model_dump_json()) == replayed
    assert report.worst == ("a", 0.1)
    verified = Verified(
        job_id="job-aaaaaaaa",
        attempt=1,
        outcome="failed",
        replay_job_id="job-bbbbbbbb",
        worker_id="w1",
        from_step=4,
        to_step=6,
        tolerance=0.05,
        loss_tolerance=0.05,
        replayed_steps=2,
        job_steps=6,
        overhead=2 / 6,
        policy="fail",
    )
    assert events.validate_json(verified.model_dump_json()) == verified
    assert Verification(replay_job_id="job-b", attempt=1, from_step=4, to_step=6).outcome == (
        "pending"
    )

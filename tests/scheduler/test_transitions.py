from swarm_common.events import Cancelled, Failed, Progress, Started, Succeeded
from swarm_common.jobs import AdapterRef, JobRecord, JobSpec, JobState
from swarm_scheduler.transitions import apply_event


def record(state: JobState, attempt: int = 1) -> JobRecord:
    spec = JobSpec(name="a", base_model="tiny", dataset="ds-0123456789abcdef")
    return JobRecord(
        job_id="job-1", tenant="t", spec=spec, state=state, attempt=attempt, worker_id="w1"
    )


def test_started_moves_assigned_to_running() -> None:
    new = apply_event(record(JobState.assigned), Started(job_id="job-1", attempt=1, worker_id="w1"))
    assert new is not None and new.state == JobState.running


def test_events_of_a_stale_attempt_change_nothing() -> None:
    current = record(JobState.running, attempt=2)
    adapter = AdapterRef(name="a", version=1, store_key="adapters/t/a/1")
    assert apply_event(current, Succeeded(job_id="job-1", attempt=1, adapter=adapter)) is None
    assert (
        apply_event(
            current,
            Progress(
                job_id="job-1", attempt=1, step=3, max_steps=9, loss=1.0, lr=0.1, tokens_per_s=5
            ),
        )
        is None
    )


def test_terminal_events_end_the_job_once() -> None:
    adapter = AdapterRef(name="a", version=4, store_key="adapters/t/a/4")
    done = apply_event(
        record(JobState.running),
        Succeeded(job_id="job-1", attempt=1, adapter=adapter, metrics={"eval_loss": 1.5}),
    )
    assert done is not None and done.state == JobState.succeeded and done.adapter == adapter
    assert done.metrics["eval_loss"] == 1.5
    assert apply_event(done, Failed(job_id="job-1", attempt=1, reason="late")) is None


def test_failed_and_cancelled_carry_the_reason() -> None:
    failed = apply_event(record(JobState.running), Failed(job_id="job-1", attempt=1, reason="oom"))
    assert failed is not None and (failed.state, failed.reason) == (JobState.failed, "oom")
    cancelled = apply_event(
        record(JobState.running), Cancelled(job_id="job-1", attempt=1, reason="user")
    )
    assert cancelled is not None and cancelled.state == JobState.cancelled


def test_progress_updates_the_latest_metrics() -> None:
    new = apply_event(
        record(JobState.running),
        Progress(
            job_id="job-1", attempt=1, step=7, max_steps=10, loss=0.5, lr=1e-4, tokens_per_s=99.0
        ),
    )
    assert new is not None and new.metrics == {"step": 7, "loss": 0.5, "tokens_per_s": 99.0}

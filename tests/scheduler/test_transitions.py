from swarm_contracts.evals import EvalResult
from swarm_contracts.events import (
    Cancelled,
    CheckpointSaved,
    Failed,
    Progress,
    Replayed,
    Started,
    Succeeded,
    Validated,
)
from swarm_contracts.jobs import AdapterRef, JobRecord, JobSpec, JobState
from swarm_contracts.methods import PreferenceMetrics
from swarm_contracts.verification import ReplayReport, VerifyTarget
from swarm_scheduler.transitions import apply_event


def record(state: JobState, attempt: int = 1) -> JobRecord:
    spec = JobSpec(name="a", base_model="tiny", dataset="ds-0123456789abcdef")
    return JobRecord(
        job_id="job-1", tenant="t", spec=spec, state=state, attempt=attempt, worker_id="w1"
    )


def test_started_moves_assigned_to_running() -> None:
    new = apply_event(record(JobState.assigned), Started(job_id="job-1", attempt=1, worker_id="w1"))
    assert new is not None
    assert new.state == JobState.running


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
    assert done is not None
    assert done.state == JobState.succeeded
    assert done.adapter == adapter
    assert done.metrics["eval_loss"] == 1.5
    assert apply_event(done, Failed(job_id="job-1", attempt=1, reason="late")) is None


def test_failed_and_cancelled_carry_the_reason() -> None:
    failed = apply_event(record(JobState.running), Failed(job_id="job-1", attempt=1, reason="oom"))
    assert failed is not None
    assert (failed.state, failed.reason) == (JobState.failed, "oom")
    cancelled = apply_event(
        record(JobState.running), Cancelled(job_id="job-1", attempt=1, reason="user")
    )
    assert cancelled is not None
    assert cancelled.state == JobState.cancelled


def test_progress_updates_the_latest_metrics() -> None:
    new = apply_event(
        record(JobState.running),
        Progress(
            job_id="job-1", attempt=1, step=7, max_steps=10, loss=0.5, lr=1e-4, tokens_per_s=99.0
        ),
    )
    assert new is not None
    assert new.metrics == {"step": 7, "loss": 0.5, "tokens_per_s": 99.0}


def test_a_dpo_jobs_rewards_are_in_the_record() -> None:
    rewards = PreferenceMetrics(
        reward_accuracy=0.75, chosen_reward=0.2, rejected_reward=-0.1, margin=0.3
    )
    progress = Progress(
        job_id="job-1", attempt=1, step=3, max_steps=9, loss=0.6, lr=1e-4, tokens_per_s=9.0
    )
    new = apply_event(record(JobState.running), progress.model_copy(update={"preference": rewards}))
    assert new is not None
    assert new.metrics["reward_accuracy"] == 0.75
    assert new.metrics["margin"] == 0.3
    validated = Validated(
        job_id="job-1", attempt=1, step=3, eval_loss=0.6, perplexity=3.0, preference=rewards
    )
    later = apply_event(new, validated)
    assert later is not None
    assert (later.metrics["eval_reward_accuracy"], later.metrics["eval_loss"]) == (0.75, 0.6)


def test_an_older_report_applied_late_does_not_move_the_metrics_back() -> None:
    def progress(step: int) -> Progress:
        return Progress(
            job_id="job-1",
            attempt=1,
            step=step,
            max_steps=10,
            loss=1 / step,
            lr=1e-4,
            tokens_per_s=9.0,
        )

    at_7 = apply_event(record(JobState.running), progress(7))
    assert at_7 is not None
    assert apply_event(at_7, progress(6)) is None
    at_8 = apply_event(at_7, progress(8))
    assert at_8 is not None
    assert at_8.metrics["step"] == 8
    saved = apply_event(at_8, CheckpointSaved(job_id="job-1", attempt=1, step=6, store_key="k"))
    assert saved is not None
    assert (
        apply_event(saved, CheckpointSaved(job_id="job-1", attempt=1, step=3, store_key="k"))
        is None
    )


def test_the_record_keeps_the_run_s_last_committed_checkpoints() -> None:
    r = record(JobState.running)
    for step in (2, 4):
        new = apply_event(r, CheckpointSaved(job_id="job-1", attempt=1, step=step, store_key="k"))
        assert new is not None
        r = new
    assert r.checkpoints == [2, 4]
    adapter = AdapterRef(name="a", version=1, store_key="adapters/t/a/1")
    # The last step's checkpoint: its event may come after the end.
    done = apply_event(
        r, Succeeded(job_id="job-1", attempt=1, adapter=adapter, metrics={"step": 6})
    )
    assert done is not None
    assert done.checkpoints == [4, 6]
    # The `checkpointed` event of step 4 lost the race with the end (applied after it, so
    # never): the worker's own list in `succeeded` completes the record's.
    raced = apply_event(
        record(JobState.running).model_copy(update={"checkpoints": [2]}),
        Succeeded(
            job_id="job-1", attempt=1, adapter=adapter, metrics={"step": 6}, checkpoints=[4, 6]
        ),
    )
    assert raced is not None
    assert raced.checkpoints == [4, 6]


def test_replayed_ends_a_replay_job_only() -> None:
    report = ReplayReport(from_step=4, to_step=6, distances={"a": 0.3}, losses={5: 1.0})
    event = Replayed(job_id="job-1", attempt=1, worker_id="w1", report=report)
    assert apply_event(record(JobState.running), event) is None  # not a replay
    replay = record(JobState.running)
    replay.verify = VerifyTarget(job_id="job-0", attempt=1, worker_id="w0", from_step=4, to_step=6)
    new = apply_event(replay, event)
    assert new is not None
    assert new.state == JobState.succeeded
    assert new.metrics["max_relative_l2"] == 0.3


def test_validated_with_task_evals_puts_their_metrics_and_sample_in_the_record() -> None:
    evals = EvalResult(step=5, metrics={"exact_match": 0.75}, examples=4)
    running = record(JobState.running)
    new = apply_event(
        running,
        Validated(job_id="job-1", attempt=1, step=5, eval_loss=1.0, perplexity=2.7, evals=evals),
    )
    assert new is not None
    assert new.metrics["exact_match"] == 0.75
    assert new.metrics["eval_loss"] == 1.0
    assert new.evals == evals
    # A later validation without evals (none ran) keeps the last evaluation.
    later = apply_event(
        new, Validated(job_id="job-1", attempt=1, step=6, eval_loss=0.9, perplexity=2.5)
    )
    assert later is not None
    assert later.evals == evals

"""The job events that rank 0's progress and evaluation reports become.

One reader of ``swarm_trainer.reports`` beside ``job_trace`` (spans) and ``metrics``
(Prometheus). A committed checkpoint's event is the attempt's to send (once Ray committed it:
``Attempt._announce_checkpoint``), as are ``started`` and the terminal events, which go out
whether or not rank 0 got to report.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, stop_after_delay, wait_exponential

from swarm_contracts.evals import EvalResult
from swarm_contracts.events import JobEvent, Progress, Validated
from swarm_contracts.methods import PreferenceMetrics
from swarm_contracts.workers import Assignment
from swarm_trainer import reports

# How long an attempt's event is retried while NATS is unreachable (a restart, a dropped link)
# before the attempt gives up on it: an advisory one (progress, evaluation, checkpoint) is
# logged and dropped (the reports wait in the run's queue meanwhile, so a short outage costs no
# step's event); ``started`` or a terminal event fails the attempt as any error would.
EVENT_RETRY_S = 60.0


async def send_through_outage(
    emit: Callable[[JobEvent, int | str], Awaitable[None]],
    event: JobEvent,
    step: int | str,
    give_up: Callable[[], bool],
) -> None:
    """``emit`` the event, retried through an outage of NATS (its message id makes a retry of
    one stored after all a duplicate, which the stream drops) until ``give_up`` (a superseded
    attempt: the scheduler ignores its events anyway)."""
    patience = stop_after_delay(EVENT_RETRY_S)

    def stop(state: RetryCallState) -> bool:
        return give_up() or patience(state)

    async for retry in AsyncRetrying(
        stop=stop,
        wait=wait_exponential(multiplier=0.2, max=2.0),
        reraise=True,
    ):
        with retry:
            await emit(event, step)


def job_event(job: Assignment, report: reports.Report) -> Progress | Validated | None:
    """The event ``report`` of ``job``'s attempt becomes, if any."""
    match report:
        case reports.Progress():
            return Progress(
                job_id=job.job_id,
                attempt=job.attempt,
                step=report.step,
                max_steps=report.max_steps,
                loss=report.loss,
                lr=report.lr,
                tokens_per_s=report.tokens_per_s,
                elapsed_s=report.elapsed_s,
                tokens=round(report.tokens_per_s * report.step_s),
                preference=PreferenceMetrics.of(report.metrics),
            )
        case reports.Validated():
            return Validated(
                job_id=job.job_id,
                attempt=job.attempt,
                step=report.step,
                eval_loss=report.eval_loss,
                perplexity=report.perplexity,
                evals=EvalResult.model_validate_json(report.evals) if report.evals else None,
                preference=PreferenceMetrics.of(report.metrics),
            )
    return None

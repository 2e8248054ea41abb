"""Per-job metric series, kept in memory and rebuilt from the events stream at each start."""

from __future__ import annotations

from typing import TypeVar

from swarm_contracts.events import MEANINGS, JobEvent, Progress, Validated
from swarm_contracts.jobs import JobState
from swarm_contracts.metrics import EvalPoint, JobMetrics, TrainPoint

P = TypeVar("P", TrainPoint, EvalPoint)

# The job state an event leaves a job in, for the jobs-by-state gauge (events that leave the
# state as it was are not in it).
STATE_AFTER: dict[str, JobState] = {
    name: meaning.state_after
    for name, meaning in MEANINGS.items()
    if meaning.state_after is not None
}


def downsample(points: list[P], max_points: int | None) -> list[P]:
    """At most ``max_points`` evenly spaced points, always keeping the first and the last."""
    if max_points is None or len(points) <= max_points:
        return list(points)
    if max_points < 2:
        return [points[-1]] if max_points == 1 else []
    last, gaps = len(points) - 1, max_points - 1
    # i * last / gaps rounded half up, in integers; the spacing is > 1 here, so no index repeats.
    return [points[(2 * i * last + gaps) // (2 * gaps)] for i in range(max_points)]


class JobSeries:
    """One job: its points keyed by (attempt, step), so a redelivered event changes nothing."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.train: dict[tuple[int, int], TrainPoint] = {}
        self.eval: dict[tuple[int, int], EvalPoint] = {}
        self.state: JobState | None = None
        self.attempt = 0
        self.tokens_per_s = 0.0

    def metrics(self, max_points: int | None = None) -> JobMetrics:
        return JobMetrics(
            job_id=self.job_id,
            train=downsample(list(self.train.values()), max_points),
            eval=downsample(list(self.eval.values()), max_points),
        )


class SeriesStore:
    def __init__(self) -> None:
        self.jobs: dict[str, JobSeries] = {}

    def apply(self, event: JobEvent) -> JobSeries:
        job = self.jobs.get(event.job_id)
        if job is None:
            job = self.jobs[event.job_id] = JobSeries(event.job_id)
        if isinstance(event, Progress):
            job.train[(event.attempt, event.step)] = TrainPoint(
                step=event.step,
                loss=event.loss,
                lr=event.lr,
                tokens_per_s=event.tokens_per_s,
                attempt=event.attempt,
            )
            job.tokens_per_s = event.tokens_per_s
        elif isinstance(event, Validated):
            job.eval[(event.attempt, event.step)] = EvalPoint(
                step=event.step,
                eval_loss=event.eval_loss,
                perplexity=event.perplexity,
                attempt=event.attempt,
                task=event.evals.metrics if event.evals else {},
            )
        # A late event from a superseded attempt keeps its points but must not move the state
        # (a lost worker's last progress would otherwise mark a requeued job running).
        if event.attempt >= job.attempt:
            job.attempt = event.attempt
            job.state = STATE_AFTER.get(event.event, job.state)
        return job

    def get(self, job_id: str, max_points: int | None = None) -> JobMetrics | None:
        job = self.jobs.get(job_id)
        return job.metrics(max_points) if job else None

    def count_by_state(self) -> dict[str, int]:
        counts = {state.value: 0 for state in sorted(JobState)}
        for job in self.jobs.values():
            if job.state:
                counts[job.state.value] += 1
        return counts

    def running_tokens_per_s(self) -> float:
        return sum(j.tokens_per_s for j in self.jobs.values() if j.state == JobState.running)

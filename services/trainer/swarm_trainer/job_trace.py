"""The spans of one job attempt on this agent, in the job's trace.

Training runs in Ray worker processes, which export nothing; rank 0 stamps each report with
its wall-clock time (``at``) and how long the work took (``step_s``, ``eval_s``, ``upload_s``,
``save_s``, see ``swarm_trainer.reports``), and the agent turns those into spans with the
worker's own start and end times. So the phases are measured where they ran, and exported from here:

    trainer.job                 (child of the scheduler's placement span)
      trainer.setup             agent start .. rank 0 ready (Ray workers, model, data, resume;
                                swarm.cached: what came from the worker's cache)
      trainer.train             rank 0 ready .. last step
        trainer.validate        each evaluation
        trainer.checkpoint_upload   each checkpoint written and committed through Ray
      trainer.save              best adapter saved and uploaded by rank 0
      trainer.register          the registry request, which carries it in a traceparent
                                header: the registry's spans are its children

The attempt (``swarm_trainer.attempt.Attempt.run``) makes ``trainer.job`` the current span
while it runs, so the events it emits are recorded on it (``note_event``) and the registration
is its child.
"""

from __future__ import annotations

from types import TracebackType

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from swarm_contracts.events import JobEvent
from swarm_contracts.workers import Assignment
from swarm_runtime.tracing import context_from
from swarm_trainer.reports import CheckpointReported, Finished, Report, Started, Validated


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class JobTrace:
    def __init__(self, tracer: Tracer, job: Assignment) -> None:
        self.tracer = tracer
        self.job = tracer.start_span(
            "trainer.job",
            context=context_from(job.trace_parent),
            attributes={
                "swarm.job_id": job.job_id,
                "swarm.attempt": job.attempt,
                "swarm.worker_id": job.worker_id,
                "swarm.max_steps": job.spec.training.max_steps,
            },
        )
        self.context = trace.set_span_in_context(self.job)
        self.setup: Span | None = self._child("trainer.setup")
        self.train: Span | None = None

    def _child(self, name: str, parent: Span | None = None, start: float | None = None) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else self.context
        return self.tracer.start_span(
            name, context=context, start_time=_ns(start) if start is not None else None
        )

    def _done(
        self, name: str, at: float, took: float, parent: Span | None, step: int | None = None
    ) -> None:
        """A span that ended at ``at`` after ``took`` seconds."""
        span = self._child(name, parent, start=at - took)
        if step is not None:
            span.set_attribute("swarm.step", step)
        span.end(end_time=_ns(at))

    def __enter__(self) -> JobTrace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        _: TracebackType | None,
    ) -> None:
        if exc is not None and not isinstance(exc, GeneratorExit):
            self.job.record_exception(exc)
            self.job.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        for span in (self.setup, self.train):
            if span is not None:
                span.end()
        self.job.end()

    def observe(self, report: Report) -> None:
        """A report from rank 0, stamped with its time there."""
        at = report.at
        match report:
            case Started():
                if self.setup is not None:
                    self.setup.set_attribute("swarm.resumed_from_step", report.resumed_from_step)
                    # Base model and data: from the worker's cache (these) or the store.
                    self.setup.set_attribute("swarm.cached", list(report.cached))
                    self.setup.set_attribute("swarm.fetch_s", report.fetch_s)
                    self.setup.end(end_time=_ns(at))
                    self.setup = None
                if self.train is None:
                    self.train = self._child("trainer.train", start=at)
            case Validated():
                self._done("trainer.validate", at, report.eval_s, self.train, report.step)
            case CheckpointReported():
                name = "trainer.checkpoint_upload"
                self._done(name, at, report.upload_s, self.train, report.step)
            case Finished():
                if self.train is not None:
                    self.train.set_attribute("swarm.steps", report.step)
                    self.train.end(end_time=_ns(at - report.save_s))
                    self.train = None
                self._done("trainer.save", at, report.save_s, None)


def note_event(event: JobEvent) -> None:
    """A job event emitted within the job's span: recorded on it, a failure as its status."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.add_event(f"swarm.job.{event.event}")
    if event.event == "failed":
        span.set_status(Status(StatusCode.ERROR, str(getattr(event, "reason", ""))[:200]))

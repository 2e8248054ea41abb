"""The spans of one job attempt on this agent, in the job's trace.

Training runs in Ray worker processes, which export nothing; rank 0 stamps each report with
its wall-clock time (``at``) and how long the work took (``step_s``, ``eval_s``, ``upload_s``,
``save_s``, see ``recipe.Reporter``), and the agent turns those into spans with the worker's
own start and end times. So the phases are measured where they ran, and exported from here:

    trainer.job                 (child of the scheduler's placement span)
      trainer.setup             agent start .. rank 0 ready (Ray workers, model, data, resume)
      trainer.train             rank 0 ready .. last step
        trainer.validate        each evaluation
        trainer.checkpoint_upload   each checkpoint written and committed through Ray
      trainer.save              best adapter saved and uploaded by rank 0
      trainer.register          the registry request, which carries it in a traceparent
                                header: the registry's spans are its children

The agent makes ``trainer.job`` the current span while the attempt runs, so the events it
emits are recorded on it (``note_event``) and the registration is its child.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from swarm_common.events import JobEvent
from swarm_common.tracing import context_from
from swarm_common.workers import Assignment


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

    def _done(self, name: str, at: float, took: Any, parent: Span | None, **attrs: Any) -> None:
        took = float(took) if isinstance(took, int | float) else 0.0
        span = self._child(name, parent, start=at - took)
        span.set_attributes(attrs)
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

    def observe(self, m: dict[str, Any]) -> None:
        """A report from rank 0, stamped with its time there."""
        kind = m.get("kind")
        at = float(m["at"]) if isinstance(m.get("at"), int | float) else time.time()
        if kind == "started":
            if self.setup is not None:
                self.setup.set_attribute("swarm.resumed_from_step", m.get("resumed_from_step", 0))
                self.setup.end(end_time=_ns(at))
                self.setup = None
            if self.train is None:
                self.train = self._child("trainer.train", start=at)
        elif kind == "validated":
            step = m.get("step", 0)
            self._done("trainer.validate", at, m.get("eval_s"), self.train, **{"swarm.step": step})
        elif kind == "checkpoint":
            step = m.get("step", 0)
            name = "trainer.checkpoint_upload"
            self._done(name, at, m.get("upload_s"), self.train, **{"swarm.step": step})
        elif kind == "finished":
            save_s = m.get("save_s") if isinstance(m.get("save_s"), int | float) else 0.0
            if self.train is not None:
                self.train.set_attribute("swarm.steps", m.get("step", 0))
                self.train.end(end_time=_ns(at - save_s))
                self.train = None
            self._done("trainer.save", at, save_s, None)


def note_event(event: JobEvent) -> None:
    """A job event emitted within the job's span: recorded on it, a failure as its status."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.add_event(f"swarm.job.{event.event}")
    if event.event == "failed":
        span.set_status(Status(StatusCode.ERROR, str(getattr(event, "reason", ""))[:200]))

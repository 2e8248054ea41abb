"""One attempt of a job on this worker: started, run on Ray, reported, registered, ended.

The agent (``swarm_trainer.agent``) is the worker's presence: it heartbeats, accepts an
assignment, passes cancels and hand-backs on, and lets go of the job. An ``Attempt`` is the
rest of the attempt's life: ``started``, the Ray Train run in a thread (``run_job`` blocks in
``AttemptTrainer.fit``, so the event loop stays free), rank 0's reports turned into events,
the check that the job record still gives the attempt to this worker, a stop that Ray is slow
to carry out, the adapter's registration and the terminal event. It reaches the agent through
``Host``, as Temporal's activities reach their worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace

from swarm_contracts.events import (
    Cancelled,
    CheckpointSaved,
    Failed,
    JobEvent,
    Released,
    Replayed,
    Started,
    Succeeded,
)
from swarm_contracts.jobs import AdapterRef, utcnow
from swarm_contracts.layout import CHECKPOINTS_KEPT
from swarm_contracts.registry import RegisterAdapter
from swarm_contracts.verification import ReplayReport
from swarm_contracts.workers import Assignment, AttemptStatus
from swarm_runtime.store import ObjectStore
from swarm_runtime.store_outage import is_unreachable
from swarm_trainer import reports
from swarm_trainer.hooks import LoopHooks
from swarm_trainer.job_trace import JobTrace
from swarm_trainer.metrics import TrainerMetrics
from swarm_trainer.registration import Worker, lineage, register, trainers
from swarm_trainer.report_events import job_event, send_through_outage
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.signed_store import SignedAccess, SignedStore

if TYPE_CHECKING:
    # Imported when first needed: torch, peft and Ray Train take tens of seconds to import on
    # a loaded machine, and the agent heartbeats before that (``agent._load_training``).
    from swarm_trainer.run import RunResult

log = logging.getLogger("swarm.trainer")
# A cancelled (or handed back) run stops within a step of its training loop; one still going
# after this is being started (or stopped) by Ray, which polls no flag: it is aborted, and the
# cancel (or a hand-back of an attempt that has trained nothing yet) reported without waiting
# for Ray to finish.
STOP_S = 2.0
# Why a job paused by request is handed back (the scheduler's ``ReleaseRequest`` says the same).
PAUSE_REASON = "paused by request"


def readable(exc: BaseException) -> str:
    """One line a user can act on, out of what may be a multi-line Ray traceback."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|NotFound)\b", ln)]
    line = errors[-1] if errors else lines[-1]
    # "swarm_trainer.data.DatasetError: ..." reads better as "DatasetError: ...".
    return re.sub(r"^(?:\w+\.)+(?=\w+(?:Error|Exception|NotFound)\b)", "", line)[:1000]


class Host(Worker, Protocol):
    """What an attempt uses of its worker (``swarm_trainer.agent.TrainerAgent``), besides
    what its registration does (``registration.Worker``: NATS, its ids, the tracer)."""

    settings: TrainerSettings
    # None without store keys: each attempt's operations are granted for it (``Attempt.store``).
    store: ObjectStore | None
    metrics: TrainerMetrics | None
    hooks: LoopHooks | None

    async def status(self, job: Assignment) -> AttemptStatus:
        """Whether this worker still holds ``job``'s attempt."""
        ...

    async def emit(self, event: JobEvent, step: int | str = "") -> None:
        """Publish one of the attempt's events as this worker's."""
        ...

    def let_go(self, attempt: Attempt) -> None:
        """No longer run ``attempt``'s job here, while its run may still stop."""
        ...

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a task of the attempt's until it is done, or the worker stops."""
        ...


@dataclass(eq=False)
class Attempt:
    """One attempt of a job on this worker, from its acceptance (its ``task`` runs ``run``)
    to its last event; the agent holds it in ``TrainerAgent.active`` meanwhile."""

    host: Host = field(repr=False)
    job: Assignment
    control: Any = None
    step: int = 0
    checkpoints: list[int] = field(default_factory=list)  # the committed steps, in order
    cancel_requested: bool = False
    # Why, as the cancel request said (e.g. "pruned" from a sweep): the `cancelled` event and
    # so the job record carry it.
    cancel_reason: str = "cancelled by request"
    # Why the job is being handed back (shutdown, drain), once it is: the run commits a
    # checkpoint and stops, and the attempt emits ``released`` instead of a terminal event.
    release_reason: str | None = None
    # The record moved on (requeued, placed again, ended): this run is a stale copy.
    superseded: bool = False
    # The step the attempt resumed from (0: from the start).
    resumed_from: int = 0
    # Its `cancelled` or `released` went out before the run had stopped (``_enforce_stop``).
    reported: bool = False
    started_at: datetime = field(default_factory=utcnow)
    task: asyncio.Task[None] | None = None
    # Once a stop is asked: done when the run has stopped or its stop went out.
    stopper: asyncio.Task[None] | None = None
    trace: JobTrace | None = None

    @property
    def last_checkpoint_step(self) -> int | None:
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def store(self) -> ObjectStore:
        """The store as this attempt may use it: the worker's own, or without keys the
        registry's grants for this attempt only (docs/providers.md, *Store access*)."""
        if self.host.store is not None:
            return self.host.store
        return SignedStore(SignedAccess.of(self.host.settings, self.job))

    # --- stops asked of it -----------------------------------------------------------------

    async def request_release(self, reason: str) -> None:
        if self.cancel_requested or self.release_reason is not None:
            return
        log.info("handing back %s: %s", self.job.job_id, reason)
        self.release_reason = reason
        if self.control is not None:
            await asyncio.to_thread(_ray_get, self.control.release())
        self._watch_stop()

    async def request_cancel(self, reason: str) -> None:
        if self.cancel_requested:
            return
        self.cancel_reason = reason
        self.cancel_requested = True
        if self.control is not None:
            # Not waited for: the control actor may itself still be starting.
            await asyncio.to_thread(self.control.cancel)
        self._watch_stop()

    def _watch_stop(self) -> None:
        self.stopper = asyncio.create_task(self._enforce_stop())
        self.host.keep(self.stopper)

    async def _enforce_stop(self) -> None:
        """A run that has not stopped ``STOP_S`` after its cancel is being started (or torn
        down) by Ray, whose training loop polls no flag yet: abort it, report the cancel and
        let go of the job now, rather than when Ray is done (which, on a loaded machine, may
        be a minute: its controller is killed as soon as it has started). Likewise a hand-back
        of an attempt that has trained no step yet: it has nothing to checkpoint."""
        if self.task is None:
            return
        await asyncio.wait({self.task}, timeout=STOP_S)
        if self.task.done():
            return
        if not self.cancel_requested and self.step > self.resumed_from:
            # Training: the loop commits a checkpoint of its step and stops.
            await asyncio.wait({self.task})
            return
        if self.control is not None:
            log.info("aborting the Ray run of %s#%d", self.job.job_id, self.job.attempt)
            try:
                await asyncio.to_thread(self.control.abort)
            except Exception:
                log.warning("could not abort the run of %s", self.job.job_id, exc_info=True)
        await self._report_stopped()
        self.host.let_go(self)

    async def _report_stopped(self) -> None:
        """The attempt's `cancelled` (or `released`, when handed back) event, once, unless the
        attempt is no longer the job's."""
        if self.superseded or self.reported:
            return
        self.reported = True
        job = self.job
        event: Cancelled | Released
        if self.cancel_requested:
            event = Cancelled(
                job_id=job.job_id,
                attempt=job.attempt,
                reason=self.cancel_reason,
                last_checkpoint_step=self.last_checkpoint_step,
            )
        else:
            event = Released(
                job_id=job.job_id,
                attempt=job.attempt,
                worker_id=self.host.worker_id,
                reason=self.release_reason or "handed back",
                last_checkpoint_step=self.last_checkpoint_step,
            )
        await self._publish(event)

    # --- its run ---------------------------------------------------------------------------

    async def run(self) -> None:
        """The attempt, start to end, with its span current (see swarm_trainer.job_trace)."""
        with JobTrace(self.host.tracer, self.job) as job_trace, trace.use_span(job_trace.job):
            self.trace = job_trace
            try:
                await self._run()
            finally:
                if self.host.metrics is not None:
                    self.host.metrics.job_ended(self.job.job_id)

    async def _run(self) -> None:
        job = self.job
        try:
            from swarm_trainer.control import make_control

            self.control = await asyncio.to_thread(make_control)
            if self.cancel_requested or self.release_reason is not None:
                # Asked while we were setting up: nothing to run, nothing to checkpoint.
                await self._conclude(None)
                return
            fit = await self._start()
            await self._follow(fit)
            await self._conclude(fit.result())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            from swarm_trainer.run import PreflightError

            if self.cancel_requested or self.reported:  # aborted (``_enforce_stop``)
                log.info("job %s attempt %d stopped: %s", job.job_id, job.attempt, readable(exc))
            elif not isinstance(exc, PreflightError):
                log.exception("job %s attempt %d failed", job.job_id, job.attempt)
            # A run that failed after its lease lapsed (a frozen machine, an outage) must not
            # add a final event to a job that a newer attempt now runs.
            with contextlib.suppress(Exception):
                await self.stop_if_superseded(hand_back=False)
            if self.cancel_requested:
                await self._report_stopped()
            elif not (self.superseded or self.reported):
                await self._publish(self._failure(exc))
        finally:
            self.host.let_go(self)
            if self.control is not None:
                from swarm_trainer.control import close_control

                with contextlib.suppress(Exception):
                    await asyncio.to_thread(close_control, self.control)

    def _failure(self, exc: Exception) -> Failed | Released:
        from swarm_trainer.run import PreflightError

        ids = {"job_id": self.job.job_id, "attempt": self.job.attempt}
        if is_unreachable(exc):
            # The store is down, not the job wrong: another attempt (here or elsewhere, from
            # the last committed checkpoint) may well succeed; it counts as an attempt.
            return Released(
                **ids,
                worker_id=self.host.worker_id,
                reason=f"object store unreachable: {readable(exc)}",
                last_checkpoint_step=self.last_checkpoint_step,
                fault=True,
            )
        reason = str(exc) if isinstance(exc, PreflightError) else readable(exc)
        return Failed(**ids, reason=reason)

    async def _start(self) -> asyncio.Task[RunResult | ReplayReport | None]:
        """Emit ``started`` and run the attempt on Ray (in a thread), from the checkpoint an
        earlier attempt committed, if any."""
        from swarm_trainer.run import run_job, starting_point

        job = self.job
        if self.release_reason is not None:  # a hand-back asked while we were setting up
            await asyncio.to_thread(_ray_get, self.control.release())
        store = self.store
        resume = await asyncio.to_thread(starting_point, job, store)
        self.step = self.resumed_from = resume.step if resume is not None else 0
        await self._publish(
            Started(
                job_id=job.job_id,
                attempt=job.attempt,
                worker_id=self.host.worker_id,
                resumed_from_step=self.step,
            )
        )
        return asyncio.create_task(
            asyncio.to_thread(
                run_job,
                job,
                self.host.settings,
                store,
                self.control,
                hooks=self.host.hooks,
                resume=resume,
            )
        )

    async def _follow(self, fit: asyncio.Task[RunResult | ReplayReport | None]) -> None:
        """Until the run ends, turn rank 0's reports into events, and every heartbeat
        interval check that the job record still gives this attempt to this worker."""
        from swarm_trainer.control import drain

        interval = self.host.settings.heartbeat_interval_s
        next_check = time.monotonic() + interval
        while not fit.done():
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + interval
                await self.stop_if_superseded()
            for report in await asyncio.to_thread(drain, self.control, 0.5):
                await self._advise(report)
        for report in await asyncio.to_thread(drain, self.control, 0.0):
            await self._advise(report)

    async def _conclude(self, result: RunResult | ReplayReport | None) -> None:
        """The attempt's terminal event, if it is still the job's current attempt."""
        job = self.job
        # The run is over: a pause asked meanwhile has nothing left to hand back.
        await self.stop_if_superseded(hand_back=False)
        if self.superseded:
            # The scheduler already told the job's followers (requeued, ...): a terminal
            # event from this attempt would only mislead them.
            log.info("job %s attempt %d superseded; its run stopped", job.job_id, job.attempt)
        elif self.reported:  # its cancel or hand-back went out while Ray still ran it
            log.info("job %s attempt %d stopped", job.job_id, job.attempt)
        elif self.cancel_requested or (result is None and self.release_reason is not None):
            await self._report_stopped()
        elif result is None:
            reason = "training stopped without a result"
            await self._publish(Failed(job_id=job.job_id, attempt=job.attempt, reason=reason))
        elif isinstance(result, ReplayReport):
            # A replay registers nothing: its measurements are its result.
            replayed = Replayed(
                job_id=job.job_id, attempt=job.attempt, worker_id=self.host.worker_id, report=result
            )
            await self._publish(replayed)
        else:
            await self._finish(result)

    async def stop_if_superseded(self, hand_back: bool = True) -> None:
        """Cancel our run once the job record no longer gives this attempt to this worker.

        That happens when our lease lapsed (the machine was frozen or cut off) and the
        scheduler requeued the job; a newer attempt runs elsewhere, and ours only burns a
        worker. Its late events and its adapter are refused anyway (fenced by attempt).
        Also carries out a cancel or, while the run goes on (``hand_back``), a pause whose
        message never reached us."""
        if self.superseded:
            return
        job = self.job
        try:
            status = await self.host.status(job)
        except Exception:  # cannot tell now (NATS or the scheduler down?): ask again later
            log.warning("could not ask the scheduler about %s", job.job_id, exc_info=True)
            return
        if status.holds:
            if status.cancel_requested and not self.cancel_requested:
                # The scheduler's cancel message (core NATS) did not reach us.
                await self.request_cancel("cancelled by request")
            elif hand_back and status.release_requested and self.release_reason is None:
                # Nor its request to hand the job back (a pause).
                await self.request_release(PAUSE_REASON)
            return
        log.warning(
            "job %s attempt %d is no longer this worker's: stopping our run",
            job.job_id,
            job.attempt,
        )
        self.superseded = True
        await self.request_cancel("superseded by the scheduler")

    # --- rank 0's reports ------------------------------------------------------------------

    async def _advise(self, report: reports.Report) -> None:
        """``_on_report``, whose events are advisory: one that cannot be published within
        ``report_events.EVENT_RETRY_S`` is logged, and the training goes on (the checkpoints
        and the result are in the store, the terminal event is the attempt's own)."""
        try:
            await self._on_report(report)
        except Exception:
            log.warning(
                "could not report %s of %s", type(report).__name__, self.job.job_id, exc_info=True
            )

    async def _on_report(self, report: reports.Report) -> None:
        """Every report feeds the trace and the metrics; progress, evaluations and committed
        checkpoints also become job events (``started`` and the terminal events are the
        attempt's own: it emits them whether or not rank 0 got to report)."""
        job = self.job
        if self.trace is not None:
            self.trace.observe(report)
        if self.host.metrics is not None:
            self.host.metrics.observe(job.job_id, report)
        match report:
            case reports.Started():
                log.info(
                    "job %s attempt %d: %s from the cache, fetched in %.2f s",
                    job.job_id,
                    job.attempt,
                    ", ".join(report.cached) or "nothing",
                    report.fetch_s,
                )
            case reports.Progress():
                self.step = report.step
            case reports.CheckpointReported():
                await self._announce_checkpoint(report)
        event = job_event(job, report)
        if event is not None:
            await self._publish(event, event.step)

    async def _publish(self, event: JobEvent, step: int | str = "") -> None:
        """Every event of the attempt goes out through a short NATS outage (a restart): its
        message id makes a retried one that was stored after all a duplicate, which the
        stream drops. A superseded attempt stops trying: the scheduler ignores its events."""
        await send_through_outage(self.host.emit, event, step, give_up=lambda: self.superseded)

    async def _announce_checkpoint(self, report: reports.CheckpointReported) -> None:
        """Once Ray committed it: whoever reads the event may count on resuming from it."""
        from swarm_trainer.run import checkpoint_key, wait_committed

        job, step = self.job, report.step
        # A superseded run's checkpoint concerns nobody: a new attempt of the job waits for
        # this worker to let go of it (``TrainerAgent._retire``), so stop waiting at once.
        committed = await asyncio.to_thread(
            wait_committed,
            self.store,
            job.job_id,
            job.attempt,
            step,
            give_up=lambda: self.superseded,
        )
        if not committed:
            log.warning("checkpoint %d of %s was not committed in time", step, job.job_id)
            return
        self.checkpoints.append(step)
        key = checkpoint_key(job.job_id, job.attempt, report.dir_name)
        await self._publish(
            CheckpointSaved(job_id=job.job_id, attempt=job.attempt, step=step, store_key=key),
            step,
        )

    # --- its adapter -----------------------------------------------------------------------

    async def _finish(self, result: RunResult) -> None:
        job, host = self.job, self.host
        made = lineage(
            job,
            result.metrics,
            worker_id=host.worker_id,
            worker_ids=await trainers(host, job),
            started_at=self.started_at,
        )
        request = RegisterAdapter(
            name=job.spec.name,
            store_key=result.adapter_key,
            lineage=made,
            attempt_token=job.attempt_token,
        )
        version = await register(host, request)
        adapter = AdapterRef(
            name=version.name, version=version.version, store_key=version.store_key
        )
        await self._publish(
            Succeeded(
                job_id=job.job_id,
                attempt=job.attempt,
                adapter=adapter,
                metrics=made.metrics,
                checkpoints=self.checkpoints[-CHECKPOINTS_KEPT:],
            )
        )


def _ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=30)

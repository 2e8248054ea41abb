"""The scheduler's decisions: submissions, job events, the worker table, placement and requeue.

The job records and this process's view of them are ``swarm_scheduler.view``; every change
here goes through the view's compare-and-set writes.

Long because: every decision that changes a job record is taken here (submissions, workers'
events, cancels, pauses and resumes, requeues, placement passes, liveness), through one
compare-and-set writer; its pure parts are their own modules (placement, transitions, leases,
verification, worker_table).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from datetime import timedelta

from faststream.nats import NatsBroker
from opentelemetry.trace import NoOpTracer, Tracer

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.envelope import envelope
from swarm_contracts.events import (
    AnyJobEvent,
    Assigned,
    Cancelled,
    CancelRequest,
    Failed,
    Paused,
    Queued,
    Released,
    Requeued,
    Resumed,
    sent_by_worker,
)
from swarm_contracts.jobs import JobRecord, JobState, JobSubmission, job_id_for, utcnow
from swarm_contracts.memory_estimate import estimate_memory
from swarm_contracts.providers import token_digest
from swarm_contracts.registry import ModelVersion
from swarm_contracts.sessions import PlaceSession, ReleaseSession, SessionLease, is_session
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import (
    Assignment,
    AttemptQuery,
    AttemptStatus,
    Heartbeat,
    ReleaseRequest,
    WorkerInfo,
    WorkerOps,
)
from swarm_runtime.broker import publish_job_event
from swarm_runtime.leader import Lead
from swarm_runtime.records import Conflict, RecordTable
from swarm_runtime.rpc import Refused, Unavailable
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_runtime.tracing import child_span, traceparent
from swarm_scheduler.leases import LeaseBook, LeaseClock, overdue
from swarm_scheduler.metrics import SchedulerMetrics
from swarm_scheduler.parents import resolve_fork, resolve_parent
from swarm_scheduler.placement import HOLDING, plan
from swarm_scheduler.queue_policy import FairQueue
from swarm_scheduler.registry_client import UnknownModel, model_ref, resolve_model
from swarm_scheduler.session_leases import SESSION_PRIORITY, SessionLeases, Waiting
from swarm_scheduler.settings import SchedulerSettings
from swarm_scheduler.transitions import (
    apply_event,
    copy_record,
    is_stale,
    taken_back,
    token_matches,
)
from swarm_scheduler.verification import Verifications
from swarm_scheduler.view import JobView
from swarm_scheduler.worker_ops import WorkerOpsView
from swarm_scheduler.worker_table import PRESENT, WorkerTable

log = logging.getLogger("swarm.scheduler")
SERVICE = "scheduler"
# A worker's KV entry (read by the gateway) is rewritten when its state changes, else (its
# load, its last heartbeat) every 5 s, or less often with more than 500 workers: at most 100
# refreshes a second in all (a KV write costs the scheduler about as much as a heartbeat).
WORKER_KV_REFRESH_S = 5.0
WORKER_KV_REFRESH_PER_S = 100.0
MODEL_CACHE_S = 2.0
REASON_AFTER_S = 1.0
# A worker drained with move_jobs is asked again this often while it still holds jobs (the
# request is core NATS: a worker that missed it, reconnecting, gets the next one).
RELEASE_RESEND_S = 5.0
# A liveness check that comes this much later than asked found the scheduler itself paused.
LIVENESS_PAUSE_S = 1.0
# Asked of a worker for a job paused by request (``ReleaseRequest.reason``).
PAUSE_REASON = "paused by request"


def _fence(
    record: JobRecord | None, event: AnyJobEvent, token: str | None, worker_id: str | None
) -> str | None:
    """Why a worker's event may not touch the record (None: it may). ``worker_id`` is the
    sender as its subject names it; None only for callers that checked the sender already."""
    if record is None:
        return "no such job"
    if record.state.terminal:
        return "the job has ended"
    if is_stale(record, event):
        return f"stale attempt (the job is at attempt {record.attempt})"
    if worker_id is not None and record.worker_id != worker_id:
        return "the attempt is not this worker's"
    if not token_matches(record, token):
        return "wrong attempt token"
    return None


class Scheduler:
    def __init__(self, settings: SchedulerSettings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        self.workers = WorkerTable(settings.worker_timeout_s, slow_fraction=settings.slow_fraction)
        self.view = JobView(on_closed=self._closed)
        self.worker_ops = WorkerOpsView(self._ops_changed)
        self.verifications = Verifications(self)
        self._release_sent: dict[str, float] = {}  # worker id -> when it was last asked
        self._pause_sent: dict[str, float] = {}  # job id -> when its worker was last asked
        self.leases = LeaseBook()
        self.sessions = SessionLeases(settings.assign_timeout_s)
        self._worker_kv_written: dict[str, tuple[object, float]] = {}
        self._datasets: dict[str, DatasetInfo] = {}  # content-addressed: never change
        self._models: dict[str, tuple[ModelVersion, float]] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started_at = time.monotonic()
        # Whether this leadership term has marked the workers it never heard from as lost.
        self._unheard_checked = False
        # The app gives it the stream consumers only the leader runs.
        self.lead = Lead(SERVICE, self._leadership_changed)
        # Set by the app (swarm_scheduler.app); no-ops for a bare Scheduler.
        self.tracer: Tracer = NoOpTracer()
        self.metrics: SchedulerMetrics | None = None

    @property
    def leading(self) -> bool:
        return self.lead.leading

    # --- start and stop ----------------------------------------------------------------

    async def prepare(self) -> None:
        js = self.broker.connection.jetstream()
        await ensure_topology(js, self.subjects, self.settings.js_replicas)
        self.datasets = RecordTable(await kv_bucket(js, self.subjects, "datasets"), DatasetInfo)
        self.worker_kv = RecordTable(await kv_bucket(js, self.subjects, "workers"), WorkerInfo)
        # Cordons and drains before the first placement pass, so none places around them.
        ops_kv = await kv_bucket(js, self.subjects, "worker_ops")
        await self.worker_ops.load(ops_kv)
        self.verifications.worker_ops = RecordTable(ops_kv, WorkerOps)
        # Rebuild the view before serving: a restarted scheduler picks up where it left.
        await self.view.load(await kv_bucket(js, self.subjects, "jobs"))
        leases = await kv_bucket(js, self.subjects, "session_leases")
        await self.sessions.load(RecordTable(leases, SessionLease))
        self._started_at = time.monotonic()
        await self.lead.prepare(js, self.subjects, self.settings.leader_lease_s)

    async def _leadership_changed(self, leading: bool) -> None:
        if leading:
            # Like a restart: give workers a timeout's worth of heartbeats before trusting
            # that a silent one is gone, and count lease times from now.
            self._started_at = time.monotonic()
            self.leases.restart()
            await self.sessions.load(self.sessions.table)
            self._unheard_checked = False
            self.wake()

    async def start(self) -> None:
        self.lead.start()
        self._tasks = [
            asyncio.create_task(self.view.follow()),
            asyncio.create_task(self.worker_ops.follow()),
            asyncio.create_task(self._placement_loop()),
            asyncio.create_task(self._liveness_loop()),
        ]

    async def stop(self) -> None:
        await self.lead.stop()
        await cancel_and_wait(self._tasks)
        await self.view.close()
        await self.worker_ops.close()

    def wake(self) -> None:
        """Ask for a placement pass now rather than at the next tick."""
        self._wake.set()

    def _ops_changed(self, ops: dict[str, WorkerOps]) -> None:
        self.workers.set_ops(ops)
        for worker_id in list(self._release_sent):
            if worker_id not in ops:
                del self._release_sent[worker_id]
        self.wake()  # an uncordoned worker may take queued jobs now

    def _closed(self, job_id: str) -> None:
        # What the leases kept of a job that is no longer open.
        self.leases.forget(job_id)
        self._pause_sent.pop(job_id, None)

    async def emit(self, event: AnyJobEvent, revision: int | None = None) -> None:
        # One event of a kind per attempt: a retried publish is de-duplicated by JetStream.
        # ``revision``: the record's, for an event that may come more than once in an attempt
        # (a job paused, resumed and paused again before it is placed anew).
        msg_id = f"{event.job_id}.{event.attempt}.{event.event}"
        if revision is not None:
            msg_id += f".{revision}"
        await publish_job_event(self.broker, self.subjects, SERVICE, event, msg_id=msg_id)

    # --- submissions -----------------------------------------------------------------------

    async def submit(self, submission: JobSubmission, idempotency_key: str) -> JobRecord | None:
        """Create the job record; None when the submission must be retried later."""
        job_id = submission.job_id or job_id_for(submission.tenant, idempotency_key)
        # The view answers for duplicates; a record it has not seen yet makes the create
        # below fail, which settles it without a read per submission.
        existing = self.view.open.get(job_id)
        if existing is None and self.view.finished(job_id):
            existing = await self.view.read(job_id)  # of a finished job the view keeps no record
        if existing is not None:
            log.info("duplicate submission of %s dropped", job_id)
            return existing

        record = JobRecord(
            job_id=job_id, tenant=submission.tenant, spec=submission.spec, sweep=submission.sweep
        )
        record.trace_parent = traceparent()  # the submit span: the job's trace continues from it
        try:
            model = await self._resolve(submission.spec.base_model)
            record.base_model = model_ref(model)
            if submission.spec.from_adapter:
                record.parent, record.spec = await resolve_parent(
                    self.broker, self.subjects, record.spec, record.tenant, record.base_model
                )
            if submission.spec.from_checkpoint:
                record.fork, record.spec, record.base_model = await resolve_fork(
                    self.broker, self.subjects, record
                )
                if record.base_model.version != model.version:  # the source's version
                    model = await self._resolve(f"{model.name}@{record.base_model.version}")
            if model.shape is not None:
                # With the LoRA shape the job runs with (a parent's, when it continues one).
                ref = f"{model.name}@{model.version}"
                record.memory = estimate_memory(model.shape, record.spec, ref)
            await self._check_datasets(record)
        except Unavailable:
            log.warning("registry unavailable; submission %s will be retried", job_id)
            return None
        except (UnknownModel, LookupError) as exc:
            record.state, record.reason = JobState.failed, str(exc)

        try:
            await self.view.create(record)
        except Conflict:
            return await self.view.read(job_id) or record
        spec = record.spec  # with from_adapter, the LoRA shape is the parent's
        await self.emit(Queued(job_id=job_id, tenant=record.tenant, spec=spec))
        if record.state == JobState.failed:
            await self.emit(Failed(job_id=job_id, reason=record.reason or ""))
        self.wake()
        return record

    async def _resolve(self, ref: str) -> ModelVersion:
        """The registry's answer, reused briefly: at a hundred submissions a second, asking
        for each one costs the registry and the scheduler more than placing the job. A pinned
        ``name@version`` never changes; a bare name may move to a new version, so it is kept
        only ``MODEL_CACHE_S``."""
        now = time.monotonic()
        cached = self._models.get(ref)
        if cached is not None and ("@" in ref or now - cached[1] < MODEL_CACHE_S):
            return cached[0]
        model = await resolve_model(self.broker, self.subjects, ref)
        self._models[ref] = (model, now)
        return model

    async def _check_datasets(self, record: JobRecord) -> None:
        evals = record.spec.evals
        for field, dataset_id in (
            ("dataset", record.spec.dataset),
            ("validation", record.spec.validation),
            ("evals", evals.dataset if evals else None),
        ):
            if dataset_id and await self._dataset(record.tenant, dataset_id) is None:
                raise LookupError(
                    f"unknown {field} dataset {dataset_id!r} for tenant {record.tenant!r}"
                )

    # --- job events and cancellation ------------------------------------------------------

    async def on_job_event(
        self,
        event: AnyJobEvent,
        token: str | None = None,
        worker_id: str | None = None,
        msg_id: str | None = None,
    ) -> None:
        """A worker's ``event``, sent on its own subject (``worker_id``, which NATS binds to
        its identity). Applied to the job record, and published on the public events stream
        for everyone else (gateway, telemetry, sweeps), only if that worker holds the job's
        current attempt and ``token`` (the event's attempt token header) is the one that
        attempt's assignment carried; anything else is refused, logged, and goes nowhere."""
        if not sent_by_worker(event):
            self._refuse(event, worker_id, "only the scheduler sends this kind of event")
            return
        if self.view.finished(event.job_id):
            # A finished record never changes again (``apply_event``): an event of a finished
            # job, late or stale, needs no read of the bucket.
            self._refuse(event, worker_id, "the job has ended", level=logging.DEBUG)
            return
        record = self.view.open.get(event.job_id)
        if record is None or event.attempt > record.attempt:
            record = await self.view.read(event.job_id)  # the view may be behind a new attempt
        refusal = _fence(record, event, token, worker_id)
        if refusal is not None:
            self._refuse(event, worker_id, refusal)
            return
        # Published before it is applied: a publish that fails leaves the message unacked,
        # and its redelivery, de-duplicated by its id, still finds the record open.
        await self._publish_accepted(event, msg_id)
        if isinstance(event, Released):
            await self._released(event)
            return
        new = await self.view.modify(event.job_id, lambda r: apply_event(r, event, token))
        if new is not None and new.state.terminal:
            self.wake()
            await self.verifications.ended(new, event)

    def _refuse(
        self, event: AnyJobEvent, worker_id: str | None, reason: str, level: int = logging.WARNING
    ) -> None:
        log.log(
            level,
            "refused %s of job %s attempt %d from worker %s: %s",
            event.event,
            event.job_id,
            event.attempt,
            worker_id,
            reason,
        )

    async def _publish_accepted(self, event: AnyJobEvent, msg_id: str | None) -> None:
        # Derived from the worker's message id (a retried publish, or a redelivery to us, is
        # stored once), apart from the scheduler's own ids (job.attempt.event), and hashed:
        # the worker's id is made from its attempt token, which readers of the public stream
        # have no business computing anything from.
        msg = f"worker.{hashlib.sha256(msg_id.encode()).hexdigest()[:32]}" if msg_id else None
        await publish_job_event(self.broker, self.subjects, SERVICE, event, msg_id=msg)

    async def verify(self, job_id: str) -> None:
        """Replay part of the finished job on another worker (once per attempt)."""
        await self.verifications.request(job_id)

    async def _released(self, event: Released) -> None:
        """The worker checkpointed the attempt and stopped it: queue it again now, rather than
        when its lease runs out. Not counted against ``max_attempts`` unless the worker says it
        was at fault (``fault``): a hand-back on purpose failed nothing."""
        at = event.last_checkpoint_step
        detail = f" (from the checkpoint at step {at})" if at is not None else ""
        reason = f"handed back by worker {event.worker_id}: {event.reason}{detail}"
        await self.requeue(
            event.job_id, event.worker_id, reason, handback=not event.fault, checkpoint_step=at
        )

    async def pause(self, job_id: str, reason: str) -> None:
        """Checkpoint the job and free its worker: the worker hands it back (``released``)
        and the hand-back leaves it ``paused``. A job that is queued when the request is read
        (requeued since it was accepted: the API pauses only a job a worker holds) holds
        nothing, and is paused at once."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.state.terminal or r.cancel_requested or r.pause_requested:
                return None
            if r.verify is not None or r.state == JobState.paused:
                return None
            if r.state == JobState.queued:
                r.state, r.reason = JobState.paused, reason
            else:
                r.pause_requested, r.pause_requested_at = True, utcnow()
            return r

        new = await self.view.modify(job_id, change)
        if new is None:
            return
        if new.state == JobState.paused:
            event = Paused(job_id=job_id, attempt=new.attempt, reason=reason)
            await self.emit(event, self.view.revisions.get(job_id))
        elif new.worker_id:
            await self._ask_pause(new, time.monotonic())

    async def _ask_pause(self, record: JobRecord, now: float) -> None:
        """Ask the job's worker to checkpoint it and hand it back (core NATS: asked again
        every ``RELEASE_RESEND_S`` while it has not, and an agent that missed every request
        reads ``release_requested`` at its next check of the attempt)."""
        if record.worker_id is None:
            return
        self._pause_sent[record.job_id] = now
        request = ReleaseRequest(
            worker_id=record.worker_id, job_ids=[record.job_id], reason=PAUSE_REASON
        )
        log.info("asking worker %s to hand back %s: paused", record.worker_id, record.job_id)
        await self.broker.publish(
            envelope(SERVICE, "swarm.worker.release", request, subject=record.worker_id),
            self.subjects.release(record.worker_id),
        )

    async def _repeat_pauses(self, now: float) -> None:
        for r in list(self.view.open.values()):
            due = now - self._pause_sent.get(r.job_id, -RELEASE_RESEND_S) >= RELEASE_RESEND_S
            if due and r.pause_requested and r.state in HOLDING and r.worker_id:
                await self._ask_pause(r, now)

    async def resume(self, job_id: str, reason: str) -> None:
        """Queue a paused job again; its next attempt resumes from the latest checkpoint an
        earlier attempt committed. Anything but a paused job is left as it is."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.state != JobState.paused:
                return None
            r.state, r.reason = JobState.queued, reason
            r.pause_requested, r.pause_requested_at = False, None
            return r

        new = await self.view.modify(job_id, change)
        if new is not None:
            event = Resumed(job_id=job_id, attempt=new.attempt, reason=reason)
            await self.emit(event, self.view.revisions.get(job_id))
            self.wake()

    async def cancel(self, job_id: str, reason: str) -> None:
        def change(r: JobRecord) -> JobRecord | None:
            if r.state.terminal or r.cancel_requested:
                return None
            r.cancel_requested, r.cancel_requested_at = True, utcnow()
            if r.state in (JobState.queued, JobState.paused):
                # Nobody runs it: cancel here. A running job is stopped by its worker, which
                # listens on the same subject and reports `cancelled` itself.
                r.state, r.reason = JobState.cancelled, reason
            return r

        new = await self.view.modify(job_id, change)
        if new is not None and new.state == JobState.cancelled:
            await self.emit(Cancelled(job_id=job_id, attempt=new.attempt, reason=reason))
            await self.verifications.ended(new)
        elif new is not None and new.state in HOLDING and new.worker_id:
            # Passed on to the worker's own subject: a provider's agent may not listen to
            # every job's cancel subject. Core NATS: a worker that misses it sees
            # ``cancel_requested`` in the record at its next check.
            request = CancelRequest(job_id=job_id, reason=reason)
            await self.broker.publish(
                envelope(SERVICE, "swarm.job.cancel", request, subject=job_id),
                self.subjects.worker_cancel(new.worker_id),
            )

    async def attempt_status(self, query: AttemptQuery, worker_id: str) -> AttemptStatus:
        """Whether ``worker_id`` (the subject the question came on) holds ``query``'s attempt,
        as this process's view of the records says (every scheduler process answers)."""
        if is_session(query.job_id):
            holds = await self.sessions.holds(query.job_id, query.attempt, worker_id)
            state = JobState.running if holds else None
            return AttemptStatus(
                job_id=query.job_id, attempt=query.attempt, holds=holds, state=state
            )
        record = self.view.open.get(query.job_id)
        if record is None and not self.view.finished(query.job_id):
            record = await self.view.read(query.job_id)
        return AttemptStatus.of(record, query, worker_id)

    # --- workers ---------------------------------------------------------------------------

    async def on_heartbeat(self, heartbeat: Heartbeat, subject: str | None = None) -> None:
        if subject is not None and subject != self.subjects.heartbeat(heartbeat.worker_id):
            # NATS permissions bind a provider to its own heartbeat subject; the worker id in
            # the body must be that one too, or a provider could speak for another worker.
            log.warning("dropped a heartbeat of %s sent on %s", heartbeat.worker_id, subject)
            return
        # Every scheduler process follows heartbeats (core NATS reaches them all), so that a
        # follower that takes over already knows which workers are alive.
        info, fresh = self.workers.heartbeat(heartbeat)
        now = time.monotonic()
        if heartbeat.state == "gone":
            log.info("worker %s said goodbye", info.worker_id)
            if self.leading:
                await self._write_worker(info, now)
                # Left behind by a worker that left on purpose (its hand-back did not make
                # it in time): not a failed attempt, as a hand-back is not.
                await self._take_back_all(info.worker_id, "worker shut down", handback=True)
                await self._end_sessions(info.worker_id, f"worker {info.worker_id} shut down")
            return
        if heartbeat.state == "starting" and self.leading and info.worker_id in self.view.held:
            # A worker process that is starting runs nothing yet: whatever the records still
            # give this worker was its previous process's, lost with it. Taken back now rather
            # than when the lease runs out.
            log.warning("worker %s restarted: taking back its jobs", info.worker_id)
            await self._take_back_all(info.worker_id, f"worker {info.worker_id} restarted")
        if heartbeat.state == "starting" and self.leading:
            await self._end_sessions(info.worker_id, f"worker {info.worker_id} restarted")
        for job in heartbeat.running:
            if job.job_id in self.view.open:  # a finished job's listing keeps nothing
                self.leases.listed(job.job_id, job.attempt, now)
        self.sessions.listed_by(info.worker_id, heartbeat.sessions, now)
        if fresh:
            log.info("worker %s is alive: %s", info.worker_id, info.resources.model_dump())
            self.wake()
        if self.leading:
            await self._write_worker(info, now)

    async def _write_worker(self, info: WorkerInfo, now: float) -> None:
        """Write the worker's KV entry when its state, resources, labels or benchmark change,
        else (its load: free capacity, running jobs) at most every few seconds.

        A write per heartbeat would be hundreds of KV writes a second with many busy workers,
        for a table that the gateway only displays; placement reads the live worker table.
        """
        signature = (
            info.state,
            info.labels,
            info.resources,
            info.cordoned,
            info.draining,
            info.benchmark,  # a new measurement shows in `swarm workers` at once
        )
        previous = self._worker_kv_written.get(info.worker_id)
        # With many workers, refreshes are spread so that they stay within a write budget.
        refresh = max(WORKER_KV_REFRESH_S, len(self._worker_kv_written) / WORKER_KV_REFRESH_PER_S)
        if previous and previous[0] == signature and now - previous[1] < refresh:
            return
        self._worker_kv_written[info.worker_id] = (signature, now)
        await self.worker_kv.put(info.worker_id, info)

    async def _take_back_all(self, worker_id: str, reason: str, *, handback: bool = False) -> None:
        held = [
            r.job_id
            for r in self.view.open.values()
            if r.worker_id == worker_id and r.state in HOLDING
        ]
        await _gather(self.requeue(job_id, worker_id, reason, handback=handback) for job_id in held)

    async def _release_drained(self, now: float) -> None:
        """Ask each worker drained with ``move_jobs`` to hand back the jobs it still runs."""
        for worker_id, ops in list(self.worker_ops.ops.items()):
            if not (ops.drain and ops.move_jobs) or not self.workers.is_alive(worker_id):
                continue
            if now - self._release_sent.get(worker_id, -RELEASE_RESEND_S) < RELEASE_RESEND_S:
                continue
            held = [
                r.job_id
                for r in self.view.open.values()
                if r.worker_id == worker_id and r.state in HOLDING
            ]
            if not held:
                continue
            self._release_sent[worker_id] = now
            request = ReleaseRequest(
                worker_id=worker_id, job_ids=held, reason=ops.reason or "worker drained"
            )
            log.info("asking worker %s to hand back %s", worker_id, ", ".join(held))
            await self.broker.publish(
                envelope(SERVICE, "swarm.worker.release", request, subject=worker_id),
                self.subjects.release(worker_id),
            )

    async def _liveness_loop(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(1.0)
            paused = time.monotonic() - before - 1.0
            if paused > LIVENESS_PAUSE_S:
                # This process was paused (starved of CPU, swapped, stopped): the heartbeats of
                # that time wait unread in its socket, so silence says nothing about the
                # workers yet. Read them first; judge at the next check.
                log.warning("scheduler paused for %.1fs; liveness judged at the next check", paused)
                continue
            try:
                await self.check_liveness()
            except Exception:
                log.exception("liveness check failed")

    async def check_liveness(self) -> None:
        for info in self.workers.expire():
            log.warning(
                "worker %s lost: no heartbeat for %.0fs", info.worker_id, self.workers.timeout_s
            )
            if self.leading:
                await self.worker_kv.put(info.worker_id, info)
        if not self.leading:
            return
        now = time.monotonic()
        await self._release_drained(now)
        await self._repeat_pauses(now)
        # A worker this process has never heard from since it started (or took over) may have
        # died while no scheduler was watching; after a timeout's worth of silence it has.
        grace_over = now - self._started_at > self.workers.timeout_s
        if grace_over and not self._unheard_checked:
            self._unheard_checked = True
            await self._mark_unheard_workers_lost()
        self.leases.observe(self.view.open.values(), now)
        clock = LeaseClock(
            utcnow(),
            now,
            self.settings.assign_timeout_s,
            self.settings.cancel_grace_s,
            self.settings.pause_grace_s,
        )
        for due in overdue(
            list(self.view.open.values()),
            clock,
            alive=self.workers.is_alive,
            trust_absence=lambda w: grace_over or self.workers.known(w),
            last_listed=lambda r: self.leases.last_listed(r, now),
        ):
            log.warning("%s %s: %s", due.action, due.job_id, due.reason)
            await self.requeue(due.job_id, due.worker_id, due.reason, cancel=due.action == "cancel")
        for session, reason in self.sessions.lapsed(now, self.workers.is_alive):
            log.warning("training session %s: lease ended: %s", session, reason)
            await self.sessions.end(session, reason)
            self.wake()

    # --- training sessions (swarm_scheduler.session_leases) ----------------------------------

    def _leader_only(self) -> None:
        if not self.leading:
            # Every scheduler process hears the request; the gateway asks again at once.
            raise Refused("this scheduler process is not leading", "internal")

    async def place_session(self, request: PlaceSession) -> SessionLease:
        """Lease a worker's room to a training session (or to its next attempt, off ``avoid``)."""
        self._leader_only()
        lease = await self._lease_session(request)
        log.info(
            "training session %s (attempt %d) placed on %s",
            lease.session,
            lease.attempt,
            lease.worker_id,
        )
        return lease

    async def _lease_session(self, request: PlaceSession, asked: bool = True) -> SessionLease:
        jobs = self.view.open.values()
        tenant_jobs = Counter(j.tenant for j in jobs if j.worker_id and j.state in HOLDING)
        return await self.sessions.place(
            request,
            self.workers.pool(),
            self.view.held,
            tenant_jobs,
            self.settings.tenant_max_running,
            self.workers.held_back(),
            providers=self.settings.sessions_on_providers,
            asked=asked,
        )

    async def _place_waiting_sessions(self, queued: list[JobRecord], jobs: list[JobRecord]) -> None:
        """Training sessions waiting for room take it in the fair order of the queued jobs
        (their tenant's running work, then who was served longest ago, then since when they
        wait): one ahead of the first queued job is leased room now, before the jobs' pass
        can fill it, and its gateway finds the lease when it next asks (each second)."""
        waiting = self.sessions.waiting_now()
        if not waiting:
            return
        queue = FairQueue(queued, jobs, self.settings.tenant_max_running, self.sessions.running())
        head = queue.head_rank()

        def rank(w: Waiting) -> tuple[object, ...]:
            return queue.rank(w.request.tenant, w.since, w.request.session, SESSION_PRIORITY)

        for w in sorted(waiting, key=rank):
            if head is not None and rank(w) > head:
                break
            with contextlib.suppress(Refused):
                lease = await self._lease_session(w.request, asked=False)
                log.info(
                    "training session %s (attempt %d), waiting since %s, placed on %s",
                    lease.session,
                    lease.attempt,
                    w.since.isoformat(),
                    lease.worker_id,
                )

    async def release_session(self, request: ReleaseSession) -> SessionLease:
        self._leader_only()
        lease = await self.sessions.release(request)
        self.wake()  # its room may take a queued job
        return lease

    async def _end_sessions(self, worker_id: str, reason: str) -> None:
        for session in self.sessions.of_worker(worker_id):
            await self.sessions.end(session, reason)
        self.wake()

    async def _mark_unheard_workers_lost(self) -> None:
        """Workers whose records still say they are there but who have not sent a heartbeat
        since this process started leading died while no scheduler watched: without this,
        their records (what ``GET /v1/workers`` shows) would say ``alive`` for ever."""
        for info in await self.worker_kv.all():
            if info.state in PRESENT and not self.workers.known(info.worker_id):
                log.warning("worker %s lost: silent since this scheduler leads", info.worker_id)
                await self.worker_kv.put(info.worker_id, info.model_copy(update={"state": "lost"}))

    async def requeue(
        self,
        job_id: str,
        worker_id: str,
        reason: str,
        *,
        cancel: bool = False,
        handback: bool = False,
        checkpoint_step: int | None = None,
    ) -> None:
        """Take the job back from ``worker_id``: queue it again, pause it if a pause was
        asked, or end it if it must end.

        Every requeue takes a new attempt number, but only attempts that failed (the worker
        lost, restarted, silent, or at fault) count against ``max_attempts`` (``faults``).
        ``handback``: the worker gave it back on purpose (drain, shutdown, pause): nothing
        failed. ``checkpoint_step``: the last one it committed, as it said."""

        change = functools.partial(
            taken_back,
            worker_id=worker_id,
            reason=reason,
            cancel=cancel,
            handback=handback,
            max_attempts=self.settings.max_attempts,
        )
        new = await self.view.modify(job_id, change)
        if new is None:
            return
        if new.state == JobState.queued:
            await self.emit(Requeued(job_id=job_id, attempt=new.attempt, reason=reason))
            self.wake()
        elif new.state == JobState.paused:
            self._pause_sent.pop(job_id, None)
            paused = Paused(
                job_id=job_id,
                attempt=new.attempt,
                reason=new.reason or reason,
                last_checkpoint_step=checkpoint_step,
            )
            await self.emit(paused, self.view.revisions.get(job_id))
            self.wake()  # its worker's room is free
        elif new.state == JobState.failed:
            await self.emit(Failed(job_id=job_id, attempt=new.attempt, reason=new.reason or reason))
        else:
            await self.emit(
                Cancelled(job_id=job_id, attempt=new.attempt, reason=new.reason or reason)
            )
        if new.state.terminal:
            await self.verifications.ended(new)  # a replay that could not be done

    # --- placement -----------------------------------------------------------------------

    async def _placement_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if not self.leading:
                continue
            try:
                await self.place()
            except Exception:
                log.exception("placement pass failed")

    async def place(self) -> None:
        jobs = list(self.view.open.values())
        queued = [j for j in jobs if j.state == JobState.queued and not j.cancel_requested]
        await self._place_waiting_sessions(queued, jobs)
        if not queued:
            return
        result = plan(
            queued,
            self.workers.pool(),
            jobs,
            self.settings.tenant_max_running,
            self.sessions.used(self.view.held),
            self.settings.placement_order,
            self.workers.held_back,
            self.sessions.running(),
        )
        # The plan already gave each job its own room, so the writes can go out together:
        # each is a compare-and-set on its own record, and one that fails leaves its room
        # unused until the next pass rather than giving it twice.
        await _gather(self._place(job.job_id, worker_id) for job, worker_id in result.placements)
        # Why a job waits is written once it has waited a moment: in a burst most jobs are
        # placed within a pass or two, and a reason written for each would be a KV write per
        # job for a text nobody reads (a placement pass runs at least every second).
        settled = utcnow() - timedelta(seconds=REASON_AFTER_S)
        changed = [
            (job_id, reason)
            for job_id, reason in result.waiting.items()
            if (record := self.view.open[job_id]).reason != reason and record.updated_at < settled
        ]
        await _gather(
            self.view.modify(job_id, functools.partial(_with_reason, reason=reason))
            for job_id, reason in changed
        )

    async def _dataset(self, tenant: str, dataset_id: str | None) -> DatasetInfo | None:
        if not dataset_id:
            return None
        key = f"{tenant}.{dataset_id}"
        if key not in self._datasets:
            found = await self.datasets.get(key)
            if found is None:
                return None
            self._datasets[key] = found[0]
        return self._datasets[key]

    async def _assign(self, job_id: str, worker_id: str) -> None:
        record = self.view.open.get(job_id)  # gone if it finished (was cancelled) since the plan
        if record is None:
            return
        revision = self.view.revisions[job_id]
        if record.state != JobState.queued or record.base_model is None:
            return
        dataset = await self._dataset(record.tenant, record.spec.dataset)
        validation = await self._dataset(record.tenant, record.spec.validation)
        eval_id = record.spec.evals.dataset if record.spec.evals else None
        eval_dataset = await self._dataset(record.tenant, eval_id)
        if (
            dataset is None
            or (record.spec.validation and validation is None)
            or (eval_id and eval_dataset is None)
        ):
            await self._fail(job_id, "the job's dataset was deleted before it could run")
            return

        new = copy_record(record)
        new.state, new.attempt, new.worker_id, new.reason = (
            JobState.assigned,
            record.attempt + 1,
            worker_id,
            None,
        )
        new.checkpoints = []  # the new attempt's run has none yet
        token = secrets.token_urlsafe(24)
        new.attempt_token_sha256 = token_digest(token)
        new.updated_at = new.assigned_at = utcnow()
        try:
            await self.view.update(new, revision)
        except Conflict:
            return  # changed under us (cancelled, say); the next pass sees the new record
        if self.metrics is not None:
            self.metrics.placed(record)
        assignment = Assignment(
            job_id=job_id,
            attempt=new.attempt,
            tenant=new.tenant,
            worker_id=worker_id,
            spec=new.spec,
            base_model=new.base_model,
            dataset=dataset,
            validation=validation,
            eval_dataset=eval_dataset,
            trace_parent=traceparent(),  # the placement span: the trainer continues from it
            parent=new.parent,
            fork=new.fork,
            attempt_token=token,
            verify=new.verify,
            resume_after_attempt=new.resume_after_attempt,
        )
        # Both publishes go out together, one round trip instead of two. The event is sent
        # first, so it is on the events stream before the worker can report on the attempt.
        await asyncio.gather(
            self.emit(Assigned(job_id=job_id, attempt=new.attempt, worker_id=worker_id)),
            self.broker.publish(
                envelope(SERVICE, "swarm.worker.assign", assignment, subject=job_id),
                self.subjects.assign(worker_id),
                stream=self.subjects.assign_stream,
                headers={"Nats-Msg-Id": f"{job_id}.{new.attempt}"},
            ),
        )
        log.debug("assigned %s attempt %d to %s", job_id, new.attempt, worker_id)

    async def _place(self, job_id: str, worker_id: str) -> None:
        """``_assign`` in a span of the job's trace (its record keeps where the trace is)."""
        cached = self.view.open.get(job_id)  # gone if the job finished since the plan
        parent = cached.trace_parent if cached else None
        attributes = {"swarm.job_id": job_id, "swarm.worker_id": worker_id}
        with child_span(self.tracer, "scheduler.place", parent, **attributes):
            await self._assign(job_id, worker_id)

    async def _fail(self, job_id: str, reason: str) -> None:
        def change(r: JobRecord) -> JobRecord | None:
            if r.state.terminal:
                return None
            r.state, r.reason = JobState.failed, reason
            return r

        new = await self.view.modify(job_id, change)
        if new is not None:
            await self.emit(Failed(job_id=job_id, attempt=new.attempt, reason=reason))
            await self.verifications.ended(new)


def _with_reason(record: JobRecord, reason: str) -> JobRecord | None:
    if record.state != JobState.queued or record.reason == reason:
        return None
    record.reason = reason
    return record


async def _gather(calls: Iterable[Awaitable[object]]) -> None:
    """Run the calls together; log (not raise) failures, so one bad write spoils no others."""
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, Exception):
            log.error("scheduler write failed: %r", result)

"""The scheduler's state and decisions: job records, the worker table, placement and requeue.

The job records live in the ``jobs`` KV bucket; this process keeps a live view of them by
watching the bucket, and changes them only by compare-and-set, so a stale view can at worst
make a write fail, never make it wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import timedelta

from faststream.nats import NatsBroker
from nats.js.kv import KV_DEL, KV_PURGE
from opentelemetry.trace import NoOpTracer, Tracer

from swarm_common.broker import publish_job_event
from swarm_common.datasets import DatasetInfo
from swarm_common.envelope import envelope
from swarm_common.events import (
    AnyJobEvent,
    Assigned,
    Cancelled,
    Failed,
    Queued,
    Requeued,
)
from swarm_common.jobs import JobRecord, JobState, JobSubmission, ModelRef, job_id_for, utcnow
from swarm_common.records import Conflict, RecordTable
from swarm_common.settings import Settings
from swarm_common.subjects import Subjects
from swarm_common.topology import ensure_topology, kv_bucket
from swarm_common.tracing import child_span, traceparent
from swarm_common.workers import Assignment, Heartbeat, WorkerInfo
from swarm_scheduler.leader import Leadership
from swarm_scheduler.leases import LeaseClock, overdue
from swarm_scheduler.metrics import SchedulerMetrics
from swarm_scheduler.parents import resolve_parent
from swarm_scheduler.placement import HOLDING, Capacity, demand, plan
from swarm_scheduler.registry_client import RegistryUnavailable, UnknownModel, resolve_model
from swarm_scheduler.transitions import apply_event, copy_record, is_stale
from swarm_scheduler.worker_table import WorkerTable

log = logging.getLogger("swarm.scheduler")
SERVICE = "scheduler"
# A worker's KV entry (read by the gateway) is rewritten when its state changes, else (its
# load, its last heartbeat) every 5 s, or less often with more than 500 workers: at most 100
# refreshes a second in all (a KV write costs the scheduler about as much as a heartbeat).
WORKER_KV_REFRESH_S = 5.0
WORKER_KV_REFRESH_PER_S = 100.0
MODEL_CACHE_S = 2.0
REASON_AFTER_S = 1.0
_NONE = Capacity(0, 0)


class Scheduler:
    def __init__(self, settings: Settings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        self.workers = WorkerTable(settings.worker_timeout_s)
        # The live view of the jobs bucket: the KV revision of every record, and the records
        # themselves only while not yet terminal, so that neither a placement pass nor the
        # garbage collector's full passes grow with the history of finished jobs (of those
        # the revision is enough to tell a stale watch entry from a newer one).
        self.revisions: dict[str, int] = {}
        self.open: dict[str, JobRecord] = {}
        # worker id -> capacity its assigned and running records hold, kept up to date on
        # every change of the view, so that a placement pass need not add up every open job.
        self._held: dict[str, Capacity] = {}
        # job id -> (attempt, monotonic time) of the last heartbeat of its worker listing it.
        self._listed: dict[str, tuple[int, float]] = {}
        self._running_seen: dict[str, float] = {}  # job id -> when this process saw it run
        # job id -> this process's writes to its record in flight, and the latest watch entry
        # of the record that came meanwhile: most are the echo of our own write, which the
        # write's answer puts in the view without parsing the record again.
        self._writing: dict[str, int] = {}
        self._parked: dict[str, object] = {}
        self._worker_kv_written: dict[str, tuple[object, float]] = {}
        self._datasets: dict[str, DatasetInfo] = {}  # content-addressed: never change
        self._models: dict[str, tuple[ModelRef, float]] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started_at = time.monotonic()
        self.holder = f"scheduler-{uuid.uuid4().hex[:8]}"
        self.leadership: Leadership | None = None
        # Called with True/False as this process gains or loses leadership (the app starts and
        # stops its stream consumers there).
        self.on_leadership: Callable[[bool], object] | None = None
        # Set by the app (swarm_scheduler.app); no-ops for a bare Scheduler.
        self.tracer: Tracer = NoOpTracer()
        self.metrics: SchedulerMetrics | None = None

    @property
    def leading(self) -> bool:
        return self.leadership is not None and self.leadership.leading

    # --- start and stop ----------------------------------------------------------------

    async def prepare(self) -> None:
        js = self.broker.connection.jetstream()
        await ensure_topology(js, self.subjects)
        self.jobs = RecordTable(await kv_bucket(js, self.subjects, "jobs"), JobRecord)
        self.datasets = RecordTable(await kv_bucket(js, self.subjects, "datasets"), DatasetInfo)
        self.worker_kv = RecordTable(await kv_bucket(js, self.subjects, "workers"), WorkerInfo)
        # Rebuild the view before serving: a restarted scheduler picks up where it left.
        self._watcher = await self.jobs.kv.watchall()
        while (entry := await self._watcher.updates(timeout=30)) is not None:
            self._apply_watch(entry)
        self._started_at = time.monotonic()
        leader_kv = await kv_bucket(js, self.subjects, "leader")
        self.leadership = Leadership(
            leader_kv, self.holder, self.settings.leader_lease_s, self._leadership_changed
        )
        await self.leadership.tick()  # decided before the consumers start

    async def _leadership_changed(self, leading: bool) -> None:
        if leading:
            # Like a restart: give workers a timeout's worth of heartbeats before trusting
            # that a silent one is gone, and count lease times from now.
            self._started_at = time.monotonic()
            self._running_seen.clear()
            self.wake()
        if self.on_leadership is not None:
            result = self.on_leadership(leading)
            if asyncio.iscoroutine(result):
                await result

    async def start(self) -> None:
        assert self.leadership is not None
        self.leadership.start()
        self._tasks = [
            asyncio.create_task(self._watch_loop()),
            asyncio.create_task(self._placement_loop()),
            asyncio.create_task(self._liveness_loop()),
        ]

    async def stop(self) -> None:
        if self.leadership is not None:
            await self.leadership.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self._watcher.stop()

    def wake(self) -> None:
        """Ask for a placement pass now rather than at the next tick."""
        self._wake.set()

    # --- the live view of job records ----------------------------------------------------

    def _apply_watch(self, entry: object) -> None:
        key, revision = entry.key, entry.revision  # type: ignore[attr-defined]
        if key in self._writing:
            parked = self._parked.get(key)
            if parked is None or parked.revision < revision:  # type: ignore[attr-defined]
                self._parked[key] = entry
            return
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:  # type: ignore[attr-defined]
            gone = self.open.pop(key, None)
            self.revisions.pop(key, None)
            if gone is not None:
                self._hold(gone, -1)
            return
        if self.revisions.get(key, 0) < revision:
            self._store(JobRecord.model_validate_json(entry.value), revision)  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def _writing_to(self, job_id: str) -> Iterator[None]:
        """Around a write to the job's record and its ``_remember``: the record's watch entries
        that come meanwhile are held back, then applied only if newer than what was written."""
        self._writing[job_id] = self._writing.get(job_id, 0) + 1
        try:
            yield
        finally:
            if (left := self._writing.pop(job_id) - 1) > 0:
                self._writing[job_id] = left
            elif (parked := self._parked.pop(job_id, None)) is not None:
                self._apply_watch(parked)

    def _remember(self, record: JobRecord, revision: int) -> None:
        # Our own writes go into the view at once: capacity must never be computed from a
        # view that misses an assignment we just made.
        if self.revisions.get(record.job_id, 0) < revision:
            self._store(record, revision)

    def finished(self, job_id: str) -> bool:
        """Whether the view has the job's record, terminal (and therefore not kept whole)."""
        return job_id in self.revisions and job_id not in self.open

    def _store(self, record: JobRecord, revision: int) -> None:
        job_id = record.job_id
        previous = self.open.get(job_id)
        if previous is not None:
            self._hold(previous, -1)
        self.revisions[job_id] = revision
        if record.state.terminal:
            self.open.pop(job_id, None)
            self._listed.pop(job_id, None)
            self._running_seen.pop(job_id, None)
        else:
            self._hold(record, +1)
            self.open[job_id] = record

    def _hold(self, record: JobRecord, sign: int) -> None:
        """Add (+1) or take back (-1) what ``record`` holds on its worker."""
        if not record.worker_id or record.state not in HOLDING:
            return
        need = demand(record.spec)
        prev = self._held.get(record.worker_id, _NONE)
        now = Capacity(prev.cpus + sign * need.cpus, prev.gpus + sign * need.gpus)
        if now == _NONE:
            del self._held[record.worker_id]
        else:
            self._held[record.worker_id] = now

    async def _watch_loop(self) -> None:
        async for entry in self._watcher:
            if entry is not None:
                self._apply_watch(entry)

    async def _modify(
        self, job_id: str, change: Callable[[JobRecord], JobRecord | None]
    ) -> JobRecord | None:
        def stamped(r: JobRecord) -> JobRecord | None:
            new = change(r)
            if new is not None:
                new.updated_at = utcnow()
            return new

        # Fast path: compare-and-set against the view's revision, saving a read; a conflict
        # (the view was behind) falls back to read-modify-write.
        # A no-op on the view is re-checked on the bucket, in case the view was behind.
        cached = self.open.get(job_id)
        if cached is not None:
            new = stamped(copy_record(cached))
            if new is not None:
                revision = self.revisions[job_id]
                with contextlib.suppress(Conflict), self._writing_to(job_id):
                    self._remember(new, await self.jobs.update(job_id, new, revision))
                    return new
        with self._writing_to(job_id):
            written = await self.jobs.modify(job_id, stamped)
            if written is None:
                return None
            self._remember(*written)
            return written[0]

    async def _emit(self, event: AnyJobEvent) -> None:
        # One event of a kind per attempt: a retried publish is de-duplicated by JetStream.
        msg_id = f"{event.job_id}.{event.attempt}.{event.event}"
        await publish_job_event(self.broker, self.subjects, SERVICE, event, msg_id=msg_id)

    # --- submissions -----------------------------------------------------------------------

    async def submit(self, submission: JobSubmission, idempotency_key: str) -> JobRecord | None:
        """Create the job record; None when the submission must be retried later."""
        job_id = submission.job_id or job_id_for(submission.tenant, idempotency_key)
        # The view answers for duplicates; a record it has not seen yet makes the create
        # below fail, which settles it without a read per submission.
        existing = self.open.get(job_id)
        if existing is None and self.finished(job_id):
            found = await self.jobs.get(job_id)  # of a finished job the view keeps no record
            existing = found[0] if found is not None else None
        if existing is not None:
            log.info("duplicate submission of %s dropped", job_id)
            return existing

        record = JobRecord(job_id=job_id, tenant=submission.tenant, spec=submission.spec)
        record.trace_parent = traceparent()  # the submit span: the job's trace continues from it
        try:
            record.base_model = await self._resolve(submission.spec.base_model)
            if submission.spec.from_adapter:
                record.parent, record.spec = await resolve_parent(
                    self.broker, self.subjects, record.spec, record.tenant, record.base_model
                )
            await self._check_datasets(record)
        except RegistryUnavailable:
            log.warning("registry unavailable; submission %s will be retried", job_id)
            return None
        except (UnknownModel, LookupError) as exc:
            record.state, record.reason = JobState.failed, str(exc)

        try:
            with self._writing_to(job_id):
                self._remember(record, await self.jobs.create(job_id, record))
        except Conflict:
            return (await self.jobs.get(job_id) or (record, 0))[0]
        spec = record.spec  # with from_adapter, the LoRA shape is the parent's
        await self._emit(Queued(job_id=job_id, tenant=record.tenant, spec=spec))
        if record.state == JobState.failed:
            await self._emit(Failed(job_id=job_id, reason=record.reason or ""))
        self.wake()
        return record

    async def _resolve(self, ref: str) -> ModelRef:
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
        for field in ("dataset", "validation"):
            dataset_id = getattr(record.spec, field)
            if dataset_id and await self._dataset(record.tenant, dataset_id) is None:
                raise LookupError(
                    f"unknown {field} dataset {dataset_id!r} for tenant {record.tenant!r}"
                )

    # --- job events and cancellation ------------------------------------------------------

    async def on_job_event(self, event: AnyJobEvent) -> None:
        if event.event in ("queued", "assigned", "requeued"):
            return  # our own; already in the record
        if self.finished(event.job_id):
            # A finished record never changes again (``apply_event``): an event of a finished
            # job, late or stale, needs no read of the bucket.
            log.debug("ignored %s of finished job %s", event.event, event.job_id)
            return
        record = self.open.get(event.job_id)
        if record is None or event.attempt > record.attempt:
            found = await self.jobs.get(event.job_id)  # the view may be behind a new attempt
            record = found[0] if found is not None else None
        if record is not None and is_stale(record, event):
            log.warning(
                "rejected %s from stale attempt %d of %s (current attempt %d)",
                event.event,
                event.attempt,
                event.job_id,
                record.attempt,
            )
            return
        new = await self._modify(event.job_id, lambda r: apply_event(r, event))
        if new is not None and new.state.terminal:
            self.wake()

    async def cancel(self, job_id: str, reason: str) -> None:
        def change(r: JobRecord) -> JobRecord | None:
            if r.state.terminal or r.cancel_requested:
                return None
            r.cancel_requested, r.cancel_requested_at = True, utcnow()
            if r.state == JobState.queued:
                # Nobody runs it: cancel here. A running job is stopped by its worker, which
                # listens on the same subject and reports `cancelled` itself.
                r.state, r.reason = JobState.cancelled, reason
            return r

        new = await self._modify(job_id, change)
        if new is not None and new.state == JobState.cancelled:
            await self._emit(Cancelled(job_id=job_id, attempt=new.attempt, reason=reason))

    # --- workers ---------------------------------------------------------------------------

    async def on_heartbeat(self, heartbeat: Heartbeat) -> None:
        # Every scheduler process follows heartbeats (core NATS reaches them all), so that a
        # follower that takes over already knows which workers are alive.
        info, fresh = self.workers.heartbeat(heartbeat)
        now = time.monotonic()
        for job in heartbeat.running:
            # A stale worker (frozen past its lease, then woken) still lists the old attempt
            # until it notices: it must not hide the current attempt's confirmations.
            listed = self._listed.get(job.job_id)
            if listed is None or job.attempt >= listed[0]:
                self._listed[job.job_id] = (job.attempt, now)
        if fresh:
            log.info("worker %s is alive: %s", info.worker_id, info.resources.model_dump())
            self.wake()
        if self.leading:
            await self._write_worker(info, now)

    async def _write_worker(self, info: WorkerInfo, now: float) -> None:
        """Write the worker's KV entry when its state, resources or labels change, else (its
        load: free capacity, running jobs) at most every few seconds.

        A write per heartbeat would be hundreds of KV writes a second with many busy workers,
        for a table that the gateway only displays; placement reads the live worker table.
        """
        signature = (info.state, info.labels, info.resources)
        previous = self._worker_kv_written.get(info.worker_id)
        # With many workers, refreshes are spread so that they stay within a write budget.
        refresh = max(WORKER_KV_REFRESH_S, len(self._worker_kv_written) / WORKER_KV_REFRESH_PER_S)
        if previous and previous[0] == signature and now - previous[1] < refresh:
            return
        self._worker_kv_written[info.worker_id] = (signature, now)
        await self.worker_kv.put(info.worker_id, info)

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
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
        # A worker this process has never heard from since it started (or took over) may have
        # died while no scheduler was watching; after a timeout's worth of silence it has.
        grace_over = now - self._started_at > self.workers.timeout_s
        for r in self.open.values():
            if r.state == JobState.running:
                self._running_seen.setdefault(r.job_id, now)

        def last_listed(r: JobRecord) -> float:
            attempt, seen = self._listed.get(r.job_id, (0, 0.0))
            since = self._running_seen.get(r.job_id, now)
            return max(since, seen) if attempt == r.attempt else since

        clock = LeaseClock(
            utcnow(), now, self.settings.assign_timeout_s, self.settings.cancel_grace_s
        )
        for due in overdue(
            list(self.open.values()),
            clock,
            alive=self.workers.is_alive,
            trust_absence=lambda w: grace_over or self.workers.known(w),
            last_listed=last_listed,
        ):
            log.warning("%s %s: %s", due.action, due.job_id, due.reason)
            await self.requeue(due.job_id, due.worker_id, due.reason, cancel=due.action == "cancel")

    async def requeue(
        self, job_id: str, worker_id: str, reason: str, *, cancel: bool = False
    ) -> None:
        """Take the job back from ``worker_id``: queue it again, or end it if it must end."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.state not in HOLDING or r.worker_id != worker_id:
                return None
            if cancel:
                r.state, r.reason = JobState.cancelled, reason
            elif r.cancel_requested:
                r.state, r.reason = JobState.cancelled, f"cancelled ({reason})"
            elif r.attempt >= self.settings.max_attempts:
                r.state, r.reason = JobState.failed, f"{reason}; gave up after {r.attempt} attempts"
            else:
                r.state, r.reason, r.worker_id = JobState.queued, f"requeued: {reason}", None
                r.assigned_at = None
            return r

        new = await self._modify(job_id, change)
        if new is None:
            return
        if new.state == JobState.queued:
            await self._emit(Requeued(job_id=job_id, attempt=new.attempt, reason=reason))
            self.wake()
        elif new.state == JobState.failed:
            await self._emit(
                Failed(job_id=job_id, attempt=new.attempt, reason=new.reason or reason)
            )
        else:
            await self._emit(
                Cancelled(job_id=job_id, attempt=new.attempt, reason=new.reason or reason)
            )

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
        jobs = list(self.open.values())
        queued = [j for j in jobs if j.state == JobState.queued and not j.cancel_requested]
        if not queued:
            return
        result = plan(
            queued, self.workers.pool(), jobs, self.settings.tenant_max_running, self._held
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
            if (record := self.open[job_id]).reason != reason and record.updated_at < settled
        ]
        await _gather(
            self._modify(job_id, lambda r, why=reason: _with_reason(r, why))
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
        record = self.open.get(job_id)  # gone if it finished (was cancelled) since the plan
        if record is None:
            return
        revision = self.revisions[job_id]
        if record.state != JobState.queued or record.base_model is None:
            return
        dataset = await self._dataset(record.tenant, record.spec.dataset)
        validation = await self._dataset(record.tenant, record.spec.validation)
        if dataset is None or (record.spec.validation and validation is None):
            await self._fail(job_id, "the job's dataset was deleted before it could run")
            return

        new = copy_record(record)
        new.state, new.attempt, new.worker_id, new.reason = (
            JobState.assigned,
            record.attempt + 1,
            worker_id,
            None,
        )
        new.updated_at = new.assigned_at = utcnow()
        try:
            with self._writing_to(job_id):
                self._remember(new, await self.jobs.update(job_id, new, revision))
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
            trace_parent=traceparent(),  # the placement span: the trainer continues from it
            parent=new.parent,
        )
        # Both publishes go out together, one round trip instead of two. The event is sent
        # first, so it is on the events stream before the worker can report on the attempt.
        await asyncio.gather(
            self._emit(Assigned(job_id=job_id, attempt=new.attempt, worker_id=worker_id)),
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
        cached = self.open.get(job_id)  # gone if the job finished since the plan
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

        new = await self._modify(job_id, change)
        if new is not None:
            await self._emit(Failed(job_id=job_id, attempt=new.attempt, reason=reason))


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

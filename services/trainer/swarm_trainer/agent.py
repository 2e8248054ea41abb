"""The trainer agent: heartbeats, takes its assignments, runs them on Ray, reports events.

One agent fronts one Ray cluster (a local one, or ``RAY_ADDRESS``). The training itself
happens in a thread (``run_job`` blocks in ``TorchTrainer.fit``); the event loop stays free
for heartbeats, cancels and turning rank 0's progress into job events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue as queue_mod
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from faststream.nats import NatsBroker
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Tracer
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from swarm_common.broker import publish_job_event
from swarm_common.envelope import envelope
from swarm_common.events import (
    Cancelled,
    CancelRequest,
    CheckpointSaved,
    Failed,
    JobEvent,
    Progress,
    Started,
    Succeeded,
    Validated,
)
from swarm_common.jobs import AdapterRef, JobRecord, JobState, utcnow
from swarm_common.records import RecordTable
from swarm_common.registry import AdapterVersion, Lineage, RegisterAdapter, Reply
from swarm_common.settings import Settings
from swarm_common.store import open_store
from swarm_common.subjects import Subjects
from swarm_common.topology import ensure_topology, kv_bucket
from swarm_common.tracing import trace_headers
from swarm_common.workers import Assignment, Gpu, Heartbeat, Resources, RunningJob, parse_labels
from swarm_trainer.job_history import workers_that_ran
from swarm_trainer.job_trace import JobTrace, note_event
from swarm_trainer.metrics import TrainerMetrics
from swarm_trainer.resources import detect_resources
from swarm_trainer.run import (
    PreflightError,
    RunResult,
    checkpoint_key,
    prepare_resume,
    run_job,
    wait_committed,
)

log = logging.getLogger("swarm.trainer")
SERVICE = "trainer"
REGISTER_TIMEOUT_S = 60.0


def default_worker_id() -> str:
    # The id is a subject token and a consumer name: no dots, wildcards or spaces.
    host = re.sub(r"[^a-z0-9_-]", "-", socket.gethostname().lower())[:40] or "worker"
    return f"{host}-{uuid.uuid4().hex[:6]}"


def readable(exc: BaseException) -> str:
    """One line a user can act on, out of what may be a multi-line Ray traceback."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|NotFound)\b", ln)]
    line = errors[-1] if errors else lines[-1]
    # "swarm_trainer.data.DatasetError: ..." reads better as "DatasetError: ...".
    return re.sub(r"^(?:\w+\.)+(?=\w+(?:Error|Exception|NotFound)\b)", "", line)[:1000]


class RegistrationError(RuntimeError):
    pass


@dataclass
class ActiveJob:
    job: Assignment
    control: Any = None
    step: int = 0
    last_checkpoint_step: int | None = None
    cancel_requested: bool = False
    # The record moved on (requeued, placed again, ended): this run is a stale copy.
    superseded: bool = False
    started_at: datetime = field(default_factory=utcnow)
    task: asyncio.Task[None] | None = None
    trace: JobTrace | None = None


class TrainerAgent:
    def __init__(self, settings: Settings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        self.worker_id = settings.worker_id or default_worker_id()
        self.resources = detect_resources(settings.trainer_cpus)
        self.labels = parse_labels(settings.worker_labels)  # SWARM_WORKER_LABELS, for placement
        self.store = open_store(settings)
        self.active: dict[str, ActiveJob] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        # Set by the app (swarm_trainer.app); no-ops for a bare agent.
        self.tracer: Tracer = NoOpTracer()
        self.metrics: TrainerMetrics | None = None

    # --- start and stop ------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before the subscribers start: the streams they bind to must exist."""
        await self.broker.connect()
        js = self.broker.connection.jetstream()
        await ensure_topology(js, self.subjects)
        self.jobs = RecordTable(await kv_bucket(js, self.subjects, "jobs"), JobRecord)
        await asyncio.to_thread(self._init_ray)

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=self.resources.cpus, include_dashboard=False)

    async def start(self) -> None:
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        log.info("trainer %s ready with %s", self.worker_id, self.resources)

    async def stop(self) -> None:
        for active in list(self.active.values()):
            await self._request_cancel(active, "trainer agent shutting down")
        tasks = [t for t in [self._heartbeat_task, *(a.task for a in self.active.values())] if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- heartbeats ----------------------------------------------------------------------

    def heartbeat(self) -> Heartbeat:
        used_cpus = sum(
            a.job.spec.resources.workers * a.job.spec.resources.cpus_per_worker
            for a in self.active.values()
        )
        used_gpus = sum(
            a.job.spec.resources.workers * a.job.spec.resources.gpus_per_worker
            for a in self.active.values()
        )
        gpus: list[Gpu] = self.resources.gpus[: max(0, len(self.resources.gpus) - used_gpus)]
        return Heartbeat(
            worker_id=self.worker_id,
            resources=self.resources,
            free=Resources(
                cpus=max(0, self.resources.cpus - used_cpus),
                memory_bytes=self.resources.memory_bytes,
                gpus=gpus,
            ),
            running=[
                RunningJob(job_id=a.job.job_id, attempt=a.job.attempt, step=a.step)
                for a in self.active.values()
            ],
            labels={"ray": os.environ.get("RAY_ADDRESS", "local"), **self.labels},
        )

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await self.broker.publish(
                    envelope(SERVICE, "swarm.worker.heartbeat", self.heartbeat(), self.worker_id),
                    self.subjects.heartbeat(self.worker_id),
                )
            except Exception:  # a NATS hiccup must not end the heartbeats for good
                log.exception("heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    # --- assignments and cancels -----------------------------------------------------------

    async def accept(self, job: Assignment) -> bool:
        """Start ``job`` if the record still gives it to us, this attempt; else drop it."""
        if job.worker_id != self.worker_id or job.job_id in self.active:
            return False
        found = await self.jobs.get(job.job_id)
        if found is None:
            log.warning("dropping assignment of unknown job %s", job.job_id)
            return False
        record, _ = found
        if (
            record.state != JobState.assigned
            or record.attempt != job.attempt
            or record.worker_id != self.worker_id
            or record.cancel_requested
        ):
            log.info(
                "dropping stale assignment %s#%d (record: %s#%d on %s)",
                job.job_id,
                job.attempt,
                record.state,
                record.attempt,
                record.worker_id,
            )
            return False
        active = ActiveJob(job=job)
        self.active[job.job_id] = active
        active.task = asyncio.create_task(self._traced_run(active))
        return True

    async def cancel(self, request: CancelRequest) -> None:
        active = self.active.get(request.job_id)
        if active is not None:
            await self._request_cancel(active, request.reason)

    async def _request_cancel(self, active: ActiveJob, reason: str) -> None:
        active.cancel_requested = True
        if active.control is not None:
            await asyncio.to_thread(_ray_get, active.control.cancel.remote())

    # --- one job ---------------------------------------------------------------------------

    async def _emit(self, event: JobEvent, step: int | str = "") -> None:
        await publish_job_event(
            self.broker,
            self.subjects,
            SERVICE,
            event,
            msg_id=f"{event.job_id}.{event.attempt}.{event.event}.{step}",
        )
        note_event(event)
        if self.metrics is not None:
            self.metrics.event(event)

    async def _traced_run(self, active: ActiveJob) -> None:
        """``_run`` with the attempt's span current (see swarm_trainer.job_trace)."""
        with JobTrace(self.tracer, active.job) as job_trace, trace.use_span(job_trace.job):
            active.trace = job_trace
            try:
                await self._run(active)
            finally:
                if self.metrics is not None:
                    self.metrics.job_ended(active.job.job_id)

    async def _run(self, active: ActiveJob) -> None:
        job = active.job
        ids = {"job_id": job.job_id, "attempt": job.attempt}
        progress: Any = None
        try:
            from swarm_trainer.control import make_channels

            progress, active.control = await asyncio.to_thread(make_channels)
            if active.cancel_requested:  # a cancel that came in while we were setting up
                await asyncio.to_thread(_ray_get, active.control.cancel.remote())
            resume = await asyncio.to_thread(prepare_resume, self.store, job.job_id, job.attempt)
            resumed = resume.step if resume is not None else 0
            active.step = resumed
            await self._emit(Started(**ids, worker_id=self.worker_id, resumed_from_step=resumed))
            fit = asyncio.create_task(
                asyncio.to_thread(
                    run_job, job, self.settings, self.store, progress, active.control, resume=resume
                )
            )
            next_check = time.monotonic() + self.settings.heartbeat_interval_s
            while not fit.done():
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.settings.heartbeat_interval_s
                    await self._stop_if_superseded(active)
                for message in await asyncio.to_thread(_drain, progress, 0.5):
                    await self._on_progress(active, message)
            for message in await asyncio.to_thread(_drain, progress, 0.0):
                await self._on_progress(active, message)
            result = fit.result()
            await self._stop_if_superseded(active)
            if active.superseded:
                # The scheduler already told the job's followers (requeued, ...): a terminal
                # event from this attempt would only mislead them.
                log.info("job %s attempt %d superseded; its run stopped", job.job_id, job.attempt)
            elif active.cancel_requested:
                await self._emit(Cancelled(**ids, last_checkpoint_step=active.last_checkpoint_step))
            elif result is None:
                await self._emit(Failed(**ids, reason="training stopped without a result"))
            else:
                await self._finish(active, result)
        except asyncio.CancelledError:
            raise
        except PreflightError as exc:
            await self._emit(Failed(**ids, reason=str(exc)))
        except Exception as exc:
            log.exception("job %s attempt %d failed", job.job_id, job.attempt)
            if not active.superseded:
                await self._emit(Failed(**ids, reason=readable(exc)))
        finally:
            self.active.pop(job.job_id, None)
            if active.control is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(_kill_actors, active.control, progress)

    async def _stop_if_superseded(self, active: ActiveJob) -> None:
        """Cancel our run once the job record no longer gives this attempt to this worker.

        That happens when our lease lapsed (the machine was frozen or cut off) and the
        scheduler requeued the job; a newer attempt runs elsewhere, and ours only burns a
        worker. Its late events and its adapter are refused anyway (fenced by attempt)."""
        if active.superseded:
            return
        job = active.job
        try:
            found = await self.jobs.get(job.job_id)
        except Exception:  # cannot tell now (NATS down?): keep going, ask again later
            log.warning("could not read the record of %s", job.job_id, exc_info=True)
            return
        if found is None:
            return
        record, _ = found
        if (
            record.attempt == job.attempt
            and record.worker_id == self.worker_id
            and record.state in (JobState.assigned, JobState.running)
        ):
            return
        log.warning(
            "job %s attempt %d is now %s#%d on %s: stopping our run",
            job.job_id,
            job.attempt,
            record.state,
            record.attempt,
            record.worker_id,
        )
        active.superseded = True
        await self._request_cancel(active, "superseded by the scheduler")

    async def _on_progress(self, active: ActiveJob, m: dict[str, Any]) -> None:
        ids = {"job_id": active.job.job_id, "attempt": active.job.attempt}
        if active.trace is not None:
            active.trace.observe(m)
        if self.metrics is not None:
            self.metrics.observe(active.job.job_id, m)
        kind = m.get("kind")
        if kind == "progress":
            active.step = m["step"]
            fields = ("step", "max_steps", "loss", "lr", "tokens_per_s", "elapsed_s")
            await self._emit(Progress(**ids, **{k: m[k] for k in fields}), m["step"])
        elif kind == "validated":
            event = Validated(
                **ids, step=m["step"], eval_loss=m["eval_loss"], perplexity=m["perplexity"]
            )
            await self._emit(event, m["step"])
        elif kind == "checkpoint":
            # Announced once committed: whoever reads the event may count on resuming from it.
            job, step = active.job, m["step"]
            if not await asyncio.to_thread(
                wait_committed, self.store, job.job_id, job.attempt, step
            ):
                log.warning("checkpoint %d of %s was not committed in time", step, job.job_id)
                return
            active.last_checkpoint_step = step
            key = checkpoint_key(job.job_id, job.attempt, m["dir_name"])
            await self._emit(CheckpointSaved(**ids, step=step, store_key=key), step)

    async def _finish(self, active: ActiveJob, result: RunResult) -> None:
        job = active.job
        m = result.metrics
        metrics = {
            k: float(m[k])
            for k in ("train_loss", "eval_loss", "perplexity", "elapsed_s", "step")
            if isinstance(m.get(k), int | float)
        }
        lineage = Lineage(
            tenant=job.tenant,
            job_id=job.job_id,
            attempt=job.attempt,
            base_model=job.base_model.name,
            base_model_version=job.base_model.version,
            base_model_digest=job.base_model.digest,
            dataset=job.dataset.id,
            dataset_digest=job.dataset.sha256,
            validation_dataset=job.validation.id if job.validation else None,
            validation_digest=job.validation.sha256 if job.validation else None,
            lora=job.spec.lora,
            training=job.spec.training,
            metrics=metrics,
            eval_history=m.get("eval_history", []),
            best_step=m.get("best_step"),
            worker_id=self.worker_id,
            worker_ids=await workers_that_ran(
                self.broker.connection.jetstream(),
                self.subjects,
                job.job_id,
                job.attempt,
                self.worker_id,
            ),
            started_at=active.started_at,
            finished_at=utcnow(),
            parent=job.parent.ref if job.parent else None,
        )
        version = await self.register(
            RegisterAdapter(name=job.spec.name, store_key=result.adapter_key, lineage=lineage)
        )
        adapter = AdapterRef(
            name=version.name, version=version.version, store_key=version.store_key
        )
        await self._emit(
            Succeeded(job_id=job.job_id, attempt=job.attempt, adapter=adapter, metrics=metrics)
        )

    async def register(self, request: RegisterAdapter) -> AdapterVersion:
        """Ask the registry for a version; retried while it is unreachable (idempotent per job)."""
        attributes = {"swarm.job_id": request.lineage.job_id, "swarm.adapter": request.name}
        with self.tracer.start_as_current_span("trainer.register", attributes=attributes):
            return await self._register(request)

    async def _register(self, request: RegisterAdapter) -> AdapterVersion:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(REGISTER_TIMEOUT_S),
            wait=wait_exponential(multiplier=0.5, max=5),
            retry=retry_if_exception_type((NoRespondersError, NatsTimeout, TimeoutError)),
            reraise=True,
        ):
            with attempt:
                response = await self.broker.request(
                    request,
                    self.subjects.registry("adapters.register"),
                    timeout=10.0,
                    headers=trace_headers(),  # the registry's spans join the job's trace
                )
        reply = Reply[AdapterVersion].model_validate_json(response.body)
        if not reply.ok or reply.result is None:
            raise RegistrationError(f"registry refused the adapter: {reply.error}")
        return reply.result


def _ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=30)


def _drain(progress: Any, wait_s: float) -> list[dict[str, Any]]:
    """Everything rank 0 has sent so far, waiting up to ``wait_s`` for the first item."""
    items: list[dict[str, Any]] = []
    try:
        items.append(progress.get(block=wait_s > 0, timeout=wait_s or None))
        while True:
            items.append(progress.get_nowait())
    except queue_mod.Empty:
        pass
    return items


def _kill_actors(*handles: Any) -> None:
    import ray

    for handle in handles:
        ray.kill(getattr(handle, "actor", handle))

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
from typing import TYPE_CHECKING, Any

from faststream.nats import NatsBroker
from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Tracer
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from swarm_contracts.envelope import envelope
from swarm_contracts.evals import EvalResult
from swarm_contracts.events import (
    Cancelled,
    CancelRequest,
    CheckpointSaved,
    Failed,
    JobEvent,
    Progress,
    Released,
    Replayed,
    Started,
    Succeeded,
    Validated,
)
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState, utcnow
from swarm_contracts.layout import CHECKPOINTS_KEPT
from swarm_contracts.methods import PreferenceMetrics
from swarm_contracts.providers import read_credentials, token_digest
from swarm_contracts.registry import AdapterVersion, Lineage, RegisterAdapter
from swarm_contracts.registry_api import REGISTER_ADAPTER
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import ReplayReport
from swarm_contracts.workers import (
    ATTEMPT,
    CACHED_MODELS_MAX,
    Assignment,
    AttemptQuery,
    AttemptStatus,
    BenchmarkRequest,
    Gpu,
    Heartbeat,
    HeartbeatState,
    ReleaseRequest,
    Resources,
    RunningJob,
    WorkerBenchmark,
    parse_labels,
)
from swarm_runtime.broker import publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable
from swarm_runtime.store import ObjectStore, is_unreachable, open_store
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_trainer import reports
from swarm_trainer.benchmark_history import Benchmarks
from swarm_trainer.cache import CacheSettings
from swarm_trainer.hooks import agent_hooks
from swarm_trainer.job_history import workers_that_ran
from swarm_trainer.job_trace import JobTrace, note_event
from swarm_trainer.metrics import TrainerMetrics
from swarm_trainer.resources import detect_resources
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.signed_store import SignedAccess, SignedStore

if TYPE_CHECKING:
    # Imported when first needed (``_load_training``): torch, peft and Ray Train take tens of
    # seconds to import on a loaded machine, and the agent heartbeats before that.
    from ray.util.queue import Queue

    from swarm_trainer.run import RunResult

log = logging.getLogger("swarm.trainer")
SERVICE = "trainer"
REGISTER_TIMEOUT_S = 60.0
# A cancelled (or handed back) run stops within a step of its training loop; one still going
# after this is being started (or stopped) by Ray, which polls no flag: it is aborted, and the
# cancel (or a hand-back of an attempt that has trained nothing yet) reported without waiting
# for Ray to finish.
STOP_S = 2.0
# Why a job paused by request is handed back (the scheduler's ``ReleaseRequest`` says the same).
PAUSE_REASON = "paused by request"
# How long a worker that shuts down waits for the scheduler to take its hand-backs in.
TAKEN_BACK_WAIT_S = 10.0


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
    checkpoints: list[int] = field(default_factory=list)  # the committed steps, in order
    cancel_requested: bool = False
    # Why, as the cancel request said (e.g. "pruned" from a sweep): the `cancelled` event and
    # so the job record carry it.
    cancel_reason: str = "cancelled by request"
    # Why the job is being handed back (shutdown, drain), once it is: the run commits a
    # checkpoint and stops, and the agent emits ``released`` instead of a terminal event.
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


class TrainerAgent:
    def __init__(self, settings: TrainerSettings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        # A provider's agent (``swarm-trainer join``) is the worker its credentials name: its
        # NATS user may use that worker's subjects only.
        self.provider = (
            read_credentials(settings.provider_creds_file).provider
            if settings.provider_creds_file
            else None
        )
        self.worker_id = self.provider or settings.worker_id or default_worker_id()
        # Its GPUs are looked for in ``prepare`` (torch is slow to import), after the first
        # heartbeat, which says "starting": nothing is placed on it before they are known.
        self.resources = detect_resources(settings.trainer_cpus, gpus=False)
        self.labels = parse_labels(settings.worker_labels)  # SWARM_WORKER_LABELS, for placement
        # No store of its own without keys: each job's operations are granted for that job
        # (``store_for``).
        self.store: ObjectStore | None = (
            None if settings.store_access == "signed" else open_store(settings)
        )
        # The ranks fill it (on this machine); heartbeats say which base models it holds.
        self.cache = CacheSettings.of(settings).open()
        self.active: dict[str, ActiveJob] = {}
        # The job records (the cluster's own agents only: ``_status``).
        self.jobs: RecordTable[JobRecord] | None = None
        # Superseded runs still stopping, each replaced in ``active`` by its job's new attempt.
        self.retiring: set[asyncio.Task[None]] = set()
        self._stoppers: set[asyncio.Task[None]] = set()
        # "starting" while it starts up (``prepare``, ``start``: it takes no jobs yet; the
        # scheduler takes back any job its previous process held); "leaving" from the moment it
        # is asked to stop: no new jobs, running ones handed back.
        self.state: HeartbeatState = "alive"
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._own_ray = False  # whether this agent connected Ray (then it disconnects it)
        # The latest self-benchmark, carried by every heartbeat (swarm_trainer.benchmark).
        self.benchmark: WorkerBenchmark | None = None
        self.benchmarks = Benchmarks()
        self._benchmarking = asyncio.Lock()
        self._remeasure: asyncio.Task[bool] | None = None
        # Set by the app (swarm_trainer.app); no-ops for a bare agent.
        self.tracer: Tracer = NoOpTracer()
        self.metrics: TrainerMetrics | None = None
        # Tests only: a hook every job runs with (a deliberately dishonest worker, say).
        self.hooks = agent_hooks(settings.trainer_test_hook)

    def store_for(self, job: Assignment) -> ObjectStore:
        """The store as ``job``'s attempt may use it: the agent's own, or without keys the
        registry's grants for that attempt only (docs/providers.md, *Store access*)."""
        if self.store is not None:
            return self.store
        return SignedStore(SignedAccess.of(self.settings, job))

    # --- start and stop ------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before the subscribers start: the streams they bind to must exist.

        Heartbeats (``starting``) go out from the moment NATS is reached, before the slow
        work (importing torch and Ray Train, starting Ray, the self-benchmark): the scheduler
        then knows at once that this worker's previous process, and any job it ran, is gone,
        and does not take this one for lost while it starts."""
        await self.broker.connect()
        self.state = "starting"
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        js = self.broker.connection.jetstream()
        # Whether an attempt is still ours (``_status``): the cluster's own agents read the job
        # record; a provider may read no records (nor create or change streams: the cluster's
        # services did) and asks the scheduler instead.
        if self.provider is None:
            await ensure_topology(js, self.subjects, self.settings.js_replicas)
            self.jobs = RecordTable(await kv_bucket(js, self.subjects, "jobs"), JobRecord)
        self.scheduler = ServiceClient(
            self.broker.connection,
            "scheduler",
            lambda _: self.subjects.worker_attempt(self.worker_id),
            timeout=5.0,
        )
        await asyncio.to_thread(_load_training)
        self.resources = await asyncio.to_thread(detect_resources, self.settings.trainer_cpus)
        await asyncio.to_thread(self._init_ray)

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        self._own_ray = True
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            # "local": a Ray of its own, never one found on the host (another stack's agent,
            # someone's `ray start`), which ray.init() without an address would attach to.
            ray.init(address="local", num_cpus=self.resources.cpus, include_dashboard=False)

    async def start(self) -> None:
        if self.settings.benchmark_s > 0:
            # While still "starting", so while the machine is idle: once the scheduler hears
            # the worker is alive it may place a job here, and a shared device measures low.
            try:
                await self.measure()
            except Exception:  # a worker that cannot measure itself can still train
                log.exception("the self-benchmark failed; heartbeats go without one")
        if self.state == "starting":
            self.state = "alive"
        if self._heartbeat_task is None:  # a bare agent (tests): no prepare
            self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        else:  # now rather than an interval later: jobs may be placed here from now on
            with contextlib.suppress(Exception):
                await self._send_heartbeat()
        log.info("trainer %s ready with %s", self.worker_id, self.resources)

    async def stop(self) -> None:
        """A graceful exit (SIGTERM): say "leaving" so that the scheduler places nothing more
        here, checkpoint every running job and hand it back (``released``: requeued at once,
        resumed elsewhere from that checkpoint), then say goodbye ("gone"), so that the
        scheduler takes back anything left without waiting for the heartbeats to time out."""
        self.state = "leaving"
        with contextlib.suppress(Exception):
            await self._send_heartbeat()
        reason = "worker shutting down"
        handing_back = list(self.active.values())
        for active in handing_back:
            await self._request_release(active, reason)
        # Each until its run has stopped, or its hand-back went out (``_enforce_stop``).
        running = [a.stopper for a in handing_back if a.stopper is not None]
        if running:
            log.info("handing back %d job(s) before exiting", len(running))
            _, late = await asyncio.wait(running, timeout=self.settings.shutdown_grace_s)
            if late:
                log.warning("%d job(s) did not stop in time; left to the scheduler", len(late))
        await self._until_taken_back([a for a in handing_back if a.reported])
        tasks = [
            t
            for t in [
                self._heartbeat_task,
                self._remeasure,
                *(a.task for a in self.active.values()),
            ]
            if t
        ]
        await cancel_and_wait([*tasks, *self.retiring, *self._stoppers])
        self.state = "gone"
        with contextlib.suppress(Exception):
            await self._send_heartbeat()
        # Disconnect from Ray (and stop the local cluster it started) before the process exits;
        # a Ray connection the agent found (a test's, an embedding process's) is left alone.
        if self._own_ray:
            await asyncio.to_thread(_shutdown_ray)

    async def _until_taken_back(self, handed_back: list[ActiveJob]) -> None:
        """Until the scheduler has taken these hand-backs in (its records no longer give the
        jobs to this worker), ``TAKEN_BACK_WAIT_S`` at most. The goodbye that follows is a
        core NATS message and the ``released`` events went through a stream: the goodbye
        may well be read first, and it would then take the jobs back as left behind rather
        than as handed back from their checkpoints."""
        deadline = time.monotonic() + TAKEN_BACK_WAIT_S
        pending = list(handed_back)
        while pending and time.monotonic() < deadline:
            still = []
            for active in pending:
                try:
                    if (await self._status(active.job)).holds:
                        still.append(active)
                except Exception:  # cannot tell (NATS or the scheduler down): the goodbye decides
                    log.warning("could not ask about %s", active.job.job_id, exc_info=True)
            pending = still
            if pending:
                await asyncio.sleep(0.2)

    # --- self-benchmark ------------------------------------------------------------------

    async def measure(self, *, afresh: bool = False) -> WorkerBenchmark:
        """Run the self-benchmark (one at a time): the new result; heartbeats carry the best
        of the recent ones from now on (``Benchmarks``; ``afresh``: this one)."""
        from swarm_trainer.benchmark import run_benchmark

        async with self._benchmarking:
            try:
                result = await run_benchmark(self.settings.benchmark_s, busy=bool(self.active))
            except Exception:
                self.benchmarks.tried()
                raise
            self.benchmarks.add(result, afresh=afresh)
            self.benchmark = self.benchmarks.reported
        log.info(
            "self-benchmark: %.3g TFLOP/s (%s on %s), %.0f training tokens/s%s",
            result.matmul_tflops,
            result.dtype,
            result.device,
            result.train_tokens_per_s,
            " (busy)" if result.busy else "",
        )
        return result

    async def benchmark_requested(self, request: BenchmarkRequest) -> WorkerBenchmark:
        """``swarm workers benchmark ID``: measure again, and tell the scheduler at once."""
        if request.worker_id != self.worker_id:
            raise Refused(f"this is worker {self.worker_id}, not {request.worker_id}", "invalid")
        if self.settings.benchmark_s <= 0:
            raise Refused(
                f"worker {self.worker_id} has its self-benchmark turned off (SWARM_BENCHMARK_S=0)",
                "conflict",
            )
        result = await self.measure(afresh=True)
        if self._heartbeat_task is not None:  # not before its first heartbeat
            with contextlib.suppress(Exception):  # the next regular one carries it anyway
                await self._send_heartbeat()
        return result

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
            state=self.state,
            benchmark=self.benchmark,
            advertised_tflops=self.settings.advertised_tflops,
            cached_models=self.cache.entries("models")[:CACHED_MODELS_MAX],
            provider=self.provider,
        )

    async def _send_heartbeat(self) -> None:
        await self.broker.publish(
            envelope(SERVICE, "swarm.worker.heartbeat", self.heartbeat(), self.worker_id),
            self.subjects.heartbeat(self.worker_id),
        )

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_s
        while True:
            try:
                # Bounded: one publish stuck on a broken connection must not be the last.
                await asyncio.wait_for(self._send_heartbeat(), max(5.0, 3 * interval))
            except Exception:  # a NATS hiccup must not end the heartbeats for good
                log.exception("heartbeat failed")
            await asyncio.sleep(interval)
            idle = self._remeasure is None or self._remeasure.done()
            if idle and self.settings.benchmark_s > 0 and self._remeasure_due():
                # In its own task: a measurement (seconds) must not hold up the heartbeats.
                self._remeasure = asyncio.create_task(self.remeasure_if_due())

    def _remeasure_due(self) -> bool:
        return not self.active and self.benchmarks.due(self.settings.benchmark_every_s)

    async def remeasure_if_due(self) -> bool:
        """Measure again if the worker is idle and a new measurement is due
        (``Benchmarks.due``); whether it measured."""
        if not self._remeasure_due():
            return False
        try:
            await self.measure()
        except Exception:
            log.exception("the self-benchmark failed; heartbeats carry the earlier one")
            return False
        return True

    # --- assignments and cancels -----------------------------------------------------------

    async def accept(self, job: Assignment) -> bool:
        """Start ``job`` if the record still gives it to us, this attempt; else drop it."""
        if job.worker_id != self.worker_id:
            return False
        running = self.active.get(job.job_id)
        if running is not None and running.job.attempt < job.attempt:
            # We still run an attempt the scheduler gave up on (this machine was frozen or cut
            # off past its lease) and it placed the job here again: the new attempt replaces
            # the stale run, which is stopped meanwhile, rather than wait for it (Ray may take
            # a minute to stop a run it is starting) or be dropped (the job would then wait
            # out the assign timeout).
            await self._retire(running)
        if job.job_id in self.active:
            return False
        if self.state in ("leaving", "gone"):
            # Placed before the scheduler heard we are leaving: our goodbye makes it take the
            # job back.
            log.info("leaving: dropping assignment %s#%d", job.job_id, job.attempt)
            return False
        status = await self._status(job)
        if not status.holds or status.state != JobState.assigned or status.cancel_requested:
            log.info(
                "dropping stale assignment %s#%d (the scheduler: %s)",
                job.job_id,
                job.attempt,
                "cancelled" if status.cancel_requested else status.state or "not this worker's",
            )
            return False
        active = ActiveJob(job=job)
        if status.release_requested:
            # Paused before we began (its release request may have come before the
            # assignment): handed back at once, with nothing to checkpoint.
            active.release_reason = PAUSE_REASON
        self.active[job.job_id] = active
        active.task = asyncio.create_task(self._traced_run(active))
        return True

    async def _retire(self, active: ActiveJob) -> None:
        """Stop a superseded run and let go of its job at once (its run stops meanwhile)."""
        log.warning(
            "job %s attempt %d was placed again: stopping our stale run",
            active.job.job_id,
            active.job.attempt,
        )
        active.superseded = True
        self._let_go(active)
        await self._request_cancel(active, "superseded by the scheduler")

    def _let_go(self, active: ActiveJob) -> None:
        """No longer run ``active``'s job here (heartbeats stop listing it) while its run, if
        any, still stops in the background."""
        if self.active.get(active.job.job_id) is active:
            del self.active[active.job.job_id]
        if active.task is not None and not active.task.done():
            self.retiring.add(active.task)
            active.task.add_done_callback(self.retiring.discard)

    async def cancel(self, request: CancelRequest) -> None:
        active = self.active.get(request.job_id)
        if active is not None:
            await self._request_cancel(active, request.reason)

    async def release(self, request: ReleaseRequest) -> None:
        """The scheduler drains this worker: checkpoint these jobs and hand them back."""
        for job_id in request.job_ids:
            active = self.active.get(job_id)
            if active is not None:
                await self._request_release(active, request.reason)

    async def _request_release(self, active: ActiveJob, reason: str) -> None:
        if active.cancel_requested or active.release_reason is not None:
            return
        log.info("handing back %s: %s", active.job.job_id, reason)
        active.release_reason = reason
        if active.control is not None:
            await asyncio.to_thread(_ray_get, active.control.release.remote())
        self._watch_stop(active)

    async def _request_cancel(self, active: ActiveJob, reason: str) -> None:
        if active.cancel_requested:
            return
        active.cancel_reason = reason
        active.cancel_requested = True
        if active.control is not None:
            # Not waited for: the control actor may itself still be starting.
            await asyncio.to_thread(active.control.cancel.remote)
        self._watch_stop(active)

    def _watch_stop(self, active: ActiveJob) -> None:
        active.stopper = stopper = asyncio.create_task(self._enforce_stop(active))
        self._stoppers.add(stopper)
        stopper.add_done_callback(self._stoppers.discard)

    async def _enforce_stop(self, active: ActiveJob) -> None:
        """A run that has not stopped ``STOP_S`` after its cancel is being started (or torn
        down) by Ray, whose training loop polls no flag yet: abort it, report the cancel and
        let go of the job now, rather than when Ray is done (which, on a loaded machine, may
        be a minute: its controller is killed as soon as it has started). Likewise a hand-back
        of an attempt that has trained no step yet: it has nothing to checkpoint."""
        if active.task is None:
            return
        await asyncio.wait({active.task}, timeout=STOP_S)
        if active.task.done():
            return
        if not active.cancel_requested and active.step > active.resumed_from:
            # Training: the loop commits a checkpoint of its step and stops.
            await asyncio.wait({active.task})
            return
        if active.control is not None:
            log.info("aborting the Ray run of %s#%d", active.job.job_id, active.job.attempt)
            try:
                await asyncio.to_thread(active.control.abort.remote)
            except Exception:
                log.warning("could not abort the run of %s", active.job.job_id, exc_info=True)
        await self._report_stopped(active)
        self._let_go(active)

    async def _report_stopped(self, active: ActiveJob) -> None:
        """The attempt's `cancelled` (or `released`, when handed back) event, once, unless the
        attempt is no longer the job's."""
        if active.superseded or active.reported:
            return
        active.reported = True
        job = active.job
        event: Cancelled | Released
        if active.cancel_requested:
            event = Cancelled(
                job_id=job.job_id,
                attempt=job.attempt,
                reason=active.cancel_reason,
                last_checkpoint_step=active.last_checkpoint_step,
            )
        else:
            event = Released(
                job_id=job.job_id,
                attempt=job.attempt,
                worker_id=self.worker_id,
                reason=active.release_reason or "handed back",
                last_checkpoint_step=active.last_checkpoint_step,
            )
        await self._emit(event)

    # --- one job ---------------------------------------------------------------------------

    async def _emit(self, event: JobEvent, step: int | str = "") -> None:
        active = self.active.get(event.job_id)
        # The attempt's token proves to the scheduler that the event is this worker's.
        token = active.job.attempt_token if active and active.job.attempt == event.attempt else None
        # The workers' events stream de-duplicates by message id across all workers: an id
        # that only the attempt's holder can compute, so that no other worker can take it
        # first and have this event dropped as a duplicate.
        proof = token_digest(token)[:16] if token else "none"
        await publish_job_event(
            self.broker,
            self.subjects,
            SERVICE,
            event,
            msg_id=f"{event.job_id}.{event.attempt}.{event.event}.{step}.{proof}",
            attempt_token=token,
            worker_id=self.worker_id,
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
        progress: Queue | None = None
        try:
            from swarm_trainer.control import make_channels

            progress, active.control = await asyncio.to_thread(make_channels)
            if active.cancel_requested or active.release_reason is not None:
                # Asked while we were setting up: nothing to run, nothing to checkpoint.
                await self._conclude(active, None)
                return
            fit = await self._start(active, progress)
            await self._follow(active, fit, progress)
            await self._conclude(active, fit.result())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            from swarm_trainer.run import PreflightError

            if active.cancel_requested or active.reported:  # aborted (``_enforce_stop``)
                log.info("job %s attempt %d stopped: %s", job.job_id, job.attempt, readable(exc))
            elif not isinstance(exc, PreflightError):
                log.exception("job %s attempt %d failed", job.job_id, job.attempt)
            # A run that failed after its lease lapsed (a frozen machine, an outage) must not
            # add a final event to a job that a newer attempt now runs.
            with contextlib.suppress(Exception):
                await self._stop_if_superseded(active, hand_back=False)
            if active.cancel_requested:
                await self._report_stopped(active)
            elif not (active.superseded or active.reported):
                await self._emit(self._failure(active, exc))
        finally:
            if self.active.get(job.job_id) is active:  # not a newer attempt's entry
                del self.active[job.job_id]
            if active.control is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(_kill_actors, active.control, progress)

    def _failure(self, active: ActiveJob, exc: Exception) -> Failed | Released:
        from swarm_trainer.run import PreflightError

        ids = {"job_id": active.job.job_id, "attempt": active.job.attempt}
        if is_unreachable(exc):
            # The store is down, not the job wrong: another attempt (here or elsewhere, from
            # the last committed checkpoint) may well succeed; it counts as an attempt.
            return Released(
                **ids,
                worker_id=self.worker_id,
                reason=f"object store unreachable: {readable(exc)}",
                last_checkpoint_step=active.last_checkpoint_step,
                fault=True,
            )
        reason = str(exc) if isinstance(exc, PreflightError) else readable(exc)
        return Failed(**ids, reason=reason)

    async def _start(
        self, active: ActiveJob, progress: Queue
    ) -> asyncio.Task[RunResult | ReplayReport | None]:
        """Emit ``started`` and run the attempt on Ray (in a thread), from the checkpoint an
        earlier attempt committed, if any."""
        from swarm_trainer.run import run_job, starting_point

        job = active.job
        if active.release_reason is not None:  # a hand-back asked while we were setting up
            await asyncio.to_thread(_ray_get, active.control.release.remote())
        store = self.store_for(job)
        resume = await asyncio.to_thread(starting_point, job, store)
        active.step = active.resumed_from = resume.step if resume is not None else 0
        await self._emit(
            Started(
                job_id=job.job_id,
                attempt=job.attempt,
                worker_id=self.worker_id,
                resumed_from_step=active.step,
            )
        )
        return asyncio.create_task(
            asyncio.to_thread(
                run_job,
                job,
                self.settings,
                store,
                progress,
                active.control,
                hooks=self.hooks,
                resume=resume,
            )
        )

    async def _follow(
        self,
        active: ActiveJob,
        fit: asyncio.Task[RunResult | ReplayReport | None],
        progress: Queue,
    ) -> None:
        """Until the run ends, turn rank 0's reports into events, and every heartbeat
        interval check that the job record still gives this attempt to this worker."""
        next_check = time.monotonic() + self.settings.heartbeat_interval_s
        while not fit.done():
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.settings.heartbeat_interval_s
                await self._stop_if_superseded(active)
            for report in await asyncio.to_thread(_drain, progress, 0.5):
                await self._advise(active, report)
        for report in await asyncio.to_thread(_drain, progress, 0.0):
            await self._advise(active, report)

    async def _advise(self, active: ActiveJob, report: reports.Report) -> None:
        """``_on_report``, whose events are advisory: one that cannot be published now (NATS
        slow to acknowledge on a loaded machine) is logged, and the training goes on (the
        checkpoints and the result are in the store, the terminal event is the agent's own)."""
        try:
            await self._on_report(active, report)
        except Exception:
            log.warning(
                "could not report %s of %s", type(report).__name__, active.job.job_id, exc_info=True
            )

    async def _conclude(self, active: ActiveJob, result: RunResult | ReplayReport | None) -> None:
        """The attempt's terminal event, if it is still the job's current attempt."""
        job = active.job
        # The run is over: a pause asked meanwhile has nothing left to hand back.
        await self._stop_if_superseded(active, hand_back=False)
        if active.superseded:
            # The scheduler already told the job's followers (requeued, ...): a terminal
            # event from this attempt would only mislead them.
            log.info("job %s attempt %d superseded; its run stopped", job.job_id, job.attempt)
        elif active.reported:  # its cancel or hand-back went out while Ray still ran it
            log.info("job %s attempt %d stopped", job.job_id, job.attempt)
        elif active.cancel_requested or (result is None and active.release_reason is not None):
            await self._report_stopped(active)
        elif result is None:
            reason = "training stopped without a result"
            await self._emit(Failed(job_id=job.job_id, attempt=job.attempt, reason=reason))
        elif isinstance(result, ReplayReport):
            # A replay registers nothing: its measurements are its result.
            replayed = Replayed(
                job_id=job.job_id, attempt=job.attempt, worker_id=self.worker_id, report=result
            )
            await self._emit(replayed)
        else:
            await self._finish(active, result)

    async def _stop_if_superseded(self, active: ActiveJob, hand_back: bool = True) -> None:
        """Cancel our run once the job record no longer gives this attempt to this worker.

        That happens when our lease lapsed (the machine was frozen or cut off) and the
        scheduler requeued the job; a newer attempt runs elsewhere, and ours only burns a
        worker. Its late events and its adapter are refused anyway (fenced by attempt).
        Also carries out a cancel or, while the run goes on (``hand_back``), a pause whose
        message never reached us."""
        if active.superseded:
            return
        job = active.job
        try:
            status = await self._status(job)
        except Exception:  # cannot tell now (NATS or the scheduler down?): ask again later
            log.warning("could not ask the scheduler about %s", job.job_id, exc_info=True)
            return
        if status.holds:
            if status.cancel_requested and not active.cancel_requested:
                # The scheduler's cancel message (core NATS) did not reach us.
                await self._request_cancel(active, "cancelled by request")
            elif hand_back and status.release_requested and active.release_reason is None:
                # Nor its request to hand the job back (a pause).
                await self._request_release(active, PAUSE_REASON)
            return
        log.warning(
            "job %s attempt %d is no longer this worker's: stopping our run",
            job.job_id,
            job.attempt,
        )
        active.superseded = True
        await self._request_cancel(active, "superseded by the scheduler")

    async def _status(self, job: Assignment) -> AttemptStatus:
        """Whether this worker still holds ``job``'s attempt, as the job record says: read by
        the cluster's own agents, asked of the scheduler (on this worker's own subject) by a
        provider's, which may read no job records."""
        query = AttemptQuery(job_id=job.job_id, attempt=job.attempt)
        if self.jobs is None:
            return await self.scheduler.call(ATTEMPT, query)
        found = await self.jobs.get(job.job_id)
        return AttemptStatus.of(found[0] if found else None, query, self.worker_id)

    async def _on_report(self, active: ActiveJob, report: reports.Report) -> None:
        """Every report feeds the trace and the metrics; progress, evaluations and committed
        checkpoints also become job events (``started`` and the terminal events are the
        agent's own: it emits them whether or not rank 0 got to report)."""
        job = active.job
        if active.trace is not None:
            active.trace.observe(report)
        if self.metrics is not None:
            self.metrics.observe(job.job_id, report)
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
                active.step = report.step
                event = Progress(
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
                await self._emit(event, report.step)
            case reports.Validated():
                validated = Validated(
                    job_id=job.job_id,
                    attempt=job.attempt,
                    step=report.step,
                    eval_loss=report.eval_loss,
                    perplexity=report.perplexity,
                    evals=EvalResult.model_validate_json(report.evals) if report.evals else None,
                    preference=PreferenceMetrics.of(report.metrics),
                )
                await self._emit(validated, report.step)
            case reports.CheckpointReported():
                await self._announce_checkpoint(active, report)

    async def _announce_checkpoint(
        self, active: ActiveJob, report: reports.CheckpointReported
    ) -> None:
        """Once Ray committed it: whoever reads the event may count on resuming from it."""
        from swarm_trainer.run import checkpoint_key, wait_committed

        job, step = active.job, report.step
        # A superseded run's checkpoint concerns nobody: a new attempt of the job waits for
        # this agent to let go of it (``_retire``), so stop waiting at once.
        committed = await asyncio.to_thread(
            wait_committed,
            self.store_for(job),
            job.job_id,
            job.attempt,
            step,
            give_up=lambda: active.superseded,
        )
        if not committed:
            log.warning("checkpoint %d of %s was not committed in time", step, job.job_id)
            return
        active.checkpoints.append(step)
        key = checkpoint_key(job.job_id, job.attempt, report.dir_name)
        await self._emit(
            CheckpointSaved(job_id=job.job_id, attempt=job.attempt, step=step, store_key=key),
            step,
        )

    async def _finish(self, active: ActiveJob, result: RunResult) -> None:
        job = active.job
        m = result.metrics
        metrics = m.event_metrics()
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
            eval_history=[e.figures() for e in m.eval_history],
            best_step=m.best_step,
            worker_id=self.worker_id,
            worker_ids=await self._workers_that_ran(job),
            started_at=active.started_at,
            finished_at=utcnow(),
            parent=job.parent.ref if job.parent else None,
            forked_from=job.fork.ref if job.fork else None,
        )
        version = await self.register(
            RegisterAdapter(
                name=job.spec.name,
                store_key=result.adapter_key,
                lineage=lineage,
                attempt_token=job.attempt_token,
            )
        )
        adapter = AdapterRef(
            name=version.name, version=version.version, store_key=version.store_key
        )
        await self._emit(
            Succeeded(
                job_id=job.job_id,
                attempt=job.attempt,
                adapter=adapter,
                metrics=metrics,
                checkpoints=active.checkpoints[-CHECKPOINTS_KEPT:],
            )
        )

    async def _workers_that_ran(self, job: Assignment) -> list[str]:
        if self.provider is not None:
            # A provider may not read job events (other tenants' jobs are none of its
            # business): its lineage names itself; the job's events name the others.
            return [self.worker_id]
        return await workers_that_ran(
            self.broker.connection.jetstream(),
            self.subjects,
            job.job_id,
            job.attempt,
            self.worker_id,
        )

    async def register(self, request: RegisterAdapter) -> AdapterVersion:
        """Ask the registry for a version; retried while it is unreachable (idempotent per job)."""
        attributes = {"swarm.job_id": request.lineage.job_id, "swarm.adapter": request.name}
        with self.tracer.start_as_current_span("trainer.register", attributes=attributes):
            return await self._register(request)

    async def _register(self, request: RegisterAdapter) -> AdapterVersion:
        # On this worker's own subject: the registry registers only for the worker that
        # holds the job's current attempt.
        registry = ServiceClient(
            self.broker.connection,
            "registry",
            lambda action: self.subjects.worker_registry(action, self.worker_id),
            timeout=10.0,
        )
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(REGISTER_TIMEOUT_S),
                wait=wait_exponential(multiplier=0.5, max=5),
                retry=retry_if_exception_type(Unavailable),
                reraise=True,
            ):
                with attempt:
                    # The request carries the current span: the registry's join the job's trace.
                    return await registry.call(REGISTER_ADAPTER, request)
        except Refused as exc:
            raise RegistrationError(f"registry refused the adapter: {exc.message}") from exc
        raise AssertionError("unreachable: tenacity reraises the last error")


def _load_training() -> None:
    """Import what runs a job (torch, peft, Ray Train): tens of seconds on a loaded machine,
    paid at start-up, while the agent already heartbeats, rather than by its first job."""
    import swarm_trainer.run  # noqa: F401


def _ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=30)


def _shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _drain(progress: Queue, wait_s: float) -> list[reports.Report]:
    """Everything rank 0 has sent so far, waiting up to ``wait_s`` for the first item."""
    items: list[reports.Report] = []
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

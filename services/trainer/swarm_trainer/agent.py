"""The trainer agent: the worker's presence on the cluster.

It heartbeats (what it has, what it runs, how fast it is), takes its assignments or drops
stale ones, passes cancels and hand-backs on to the attempts it runs, and on a graceful exit
hands every job back before it says goodbye. One agent fronts one Ray cluster (a local one,
or ``RAY_ADDRESS``). Each attempt's own life (its Ray run, its reports, its registration, its
terminal event) is ``swarm_trainer.attempt.Attempt``, which reaches the agent through
``attempt.Host``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable

from faststream.nats import NatsBroker
from opentelemetry.trace import NoOpTracer, Tracer

from swarm_contracts.envelope import envelope
from swarm_contracts.events import CancelRequest, JobEvent
from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.providers import read_credentials, token_digest
from swarm_contracts.sessions import HeldSession
from swarm_contracts.subjects import Subjects
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
from swarm_runtime.rpc import Refused, ServiceClient
from swarm_runtime.store import ObjectStore, open_store
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_trainer import own_ray
from swarm_trainer.attempt import PAUSE_REASON, Attempt
from swarm_trainer.benchmark_history import Benchmarks
from swarm_trainer.cache import CacheSettings, keep_compiled_kernels
from swarm_trainer.hooks import agent_hooks
from swarm_trainer.job_trace import note_event
from swarm_trainer.metrics import TrainerMetrics
from swarm_trainer.resources import detect_resources
from swarm_trainer.settings import TrainerSettings

log = logging.getLogger("swarm.trainer")
SERVICE = "trainer"
# How long a worker that shuts down waits for the scheduler to take its hand-backs in.
TAKEN_BACK_WAIT_S = 10.0


def default_worker_id() -> str:
    # The id is a subject token and a consumer name: no dots, wildcards or spaces.
    host = re.sub(r"[^a-z0-9_-]", "-", socket.gethostname().lower())[:40] or "worker"
    return f"{host}-{uuid.uuid4().hex[:6]}"


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
        # (``Attempt.store``).
        self.store: ObjectStore | None = (
            None if settings.store_access == "signed" else open_store(settings)
        )
        # The ranks fill it (on this machine); heartbeats say which base models it holds.
        self.cache = CacheSettings.of(settings).open()
        self.active: dict[str, Attempt] = {}
        # The training sessions held here (set by the app: swarm_trainer.sessions_host), listed
        # in the heartbeats, which keeps their leases.
        self.sessions: Callable[[], list[HeldSession]] = list
        # The job records (the cluster's own agents only: ``status``).
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
        # Whether an attempt is still ours (``status``): the cluster's own agents read the job
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
        keep_compiled_kernels(self.settings.work_dir)  # before Ray starts: its workers inherit it
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
            # A Ray of its own, never one found on the host (another stack's agent, someone's
            # `ray start`), which ray.init() without an address would attach to.
            own_ray.start(
                self.resources.cpus,
                worker_logs=self.settings.ray_worker_logs,
                warm_start=self.settings.ray_warm_start and not self.resources.gpus,
            )

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
            await active.request_release(reason)
        # Each until its run has stopped, or its hand-back went out (``Attempt._enforce_stop``).
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

    async def _until_taken_back(self, handed_back: list[Attempt]) -> None:
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
                    if (await self.status(active.job)).holds:
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
            sessions=self.sessions(),
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
        status = await self.status(job)
        if not status.holds or status.state != JobState.assigned or status.cancel_requested:
            log.info(
                "dropping stale assignment %s#%d (the scheduler: %s)",
                job.job_id,
                job.attempt,
                "cancelled" if status.cancel_requested else status.state or "not this worker's",
            )
            return False
        active = Attempt(self, job)
        if status.release_requested:
            # Paused before we began (its release request may have come before the
            # assignment): handed back at once, with nothing to checkpoint.
            active.release_reason = PAUSE_REASON
        self.active[job.job_id] = active
        active.task = asyncio.create_task(active.run())
        return True

    async def _retire(self, active: Attempt) -> None:
        """Stop a superseded run and let go of its job at once (its run stops meanwhile)."""
        log.warning(
            "job %s attempt %d was placed again: stopping our stale run",
            active.job.job_id,
            active.job.attempt,
        )
        active.superseded = True
        self.let_go(active)
        await active.request_cancel("superseded by the scheduler")

    async def cancel(self, request: CancelRequest) -> None:
        active = self.active.get(request.job_id)
        if active is not None:
            await active.request_cancel(request.reason)

    async def release(self, request: ReleaseRequest) -> None:
        """The scheduler drains this worker: checkpoint these jobs and hand them back."""
        for job_id in request.job_ids:
            active = self.active.get(job_id)
            if active is not None:
                await active.request_release(request.reason)

    # --- what its attempts use of it (``attempt.Host``) -------------------------------------

    def let_go(self, attempt: Attempt) -> None:
        """No longer run ``attempt``'s job here (heartbeats stop listing it) while its run, if
        any, still stops in the background."""
        if self.active.get(attempt.job.job_id) is attempt:  # not a newer attempt's entry
            del self.active[attempt.job.job_id]
        task = attempt.task
        # Not when the attempt's own task lets go as it ends: it is done in a moment.
        if task is not None and not task.done() and task is not asyncio.current_task():
            self.retiring.add(task)
            task.add_done_callback(self.retiring.discard)

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold one of an attempt's tasks (its stop) until done; cancelled when we stop."""
        self._stoppers.add(task)
        task.add_done_callback(self._stoppers.discard)

    async def emit(self, event: JobEvent, step: int | str = "") -> None:
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

    async def status(self, job: Assignment) -> AttemptStatus:
        """Whether this worker still holds ``job``'s attempt, as the job record says: read by
        the cluster's own agents, asked of the scheduler (on this worker's own subject) by a
        provider's, which may read no job records."""
        query = AttemptQuery(job_id=job.job_id, attempt=job.attempt)
        if self.jobs is None:
            return await self.scheduler.call(ATTEMPT, query)
        found = await self.jobs.get(job.job_id)
        return AttemptStatus.of(found[0] if found else None, query, self.worker_id)

    async def holds_session(self, session: str, attempt: int) -> bool:
        """Whether the scheduler's lease of ``session`` is still this worker's ``attempt``."""
        query = AttemptQuery(job_id=session, attempt=attempt)
        return (await self.scheduler.call(ATTEMPT, query)).holds


def _load_training() -> None:
    """Import what starts a job's run (Ray Train; the ranks import torch and peft, not the
    agent: ``attempt_trainer``): seconds on a loaded machine, paid at start-up, while the
    agent already heartbeats, rather than by its first job."""
    import swarm_trainer.run  # noqa: F401


def _shutdown_ray() -> None:
    own_ray.stop()

"""The sweep controller: runs each sweep's trials as ordinary jobs, one leader at a time.

State lives in KV, never only here: a sweep record per sweep (bucket ``sweeps``) and a trial
record per trial (bucket ``trials``, key ``<sweep_id>.<trial>``) with its parameters, job id,
state and evaluations. The leader keeps a copy of the running sweeps' records (loaded when it
takes the lead, updated with every write it makes) and moves each sweep forward whenever
something happens to it:

* a job event of one of its trials (``started``, ``validated``, and the terminal ones, read
  back from the job record, which the scheduler fences by attempt);
* a cancellation; and every ``CHECK_S`` a check of its trials' job records, which also picks
  up anything that happened while no controller was leading.

Moving a sweep forward (``_advance``) submits any recorded trial not yet submitted, starts new
trials while fewer than ``max_concurrent`` are in flight and the budget is not spent, and once
every trial has ended gives the best trial's adapter version the alias ``best``.

Why a restart neither repeats nor loses a trial: trial ``n``'s job id is derived from the sweep
id and ``n`` (``trial_job_id``), so submitting it again is a no-op at the scheduler; the trial
record is written before its job is submitted, so a trial is never lost; and the parameters of
trial ``n`` are a pure function of the records before it (``swarm_sweeps.searcher``). Each
announcement is published before the record change it announces, with a ``Nats-Msg-Id`` named
after the sweep, the event and the trial, so that a controller that crashes in between and does
it again stores the event once (the stream de-duplicates over a day).

Long because: a sweep moves forward under its lock from events, cancellations and the periodic
check alike, which share its records and ``_advance``; the searchers, ASHA and the metric are
their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from faststream.nats import NatsBroker
from pydantic import ValidationError

from swarm_contracts.envelope import envelope
from swarm_contracts.events import AnyJobEvent, CancelRequest, Started, Validated
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState, JobSubmission, SweepRef, utcnow
from swarm_contracts.registry import SetAlias
from swarm_contracts.registry_api import SET_ALIAS
from swarm_contracts.subjects import Subjects
from swarm_contracts.sweeps import (
    BEST_ALIAS,
    BestChanged,
    BestTrial,
    SweepCancelled,
    SweepCancelRequest,
    SweepCompleted,
    SweepCreated,
    SweepEvent,
    SweepFailed,
    SweepRecord,
    SweepState,
    SweepSubmission,
    TrialFinished,
    TrialPruned,
    TrialRecord,
    TrialStarted,
    TrialState,
    sweep_id_for,
    trial_job_id,
    trial_key,
    trial_spec,
)
from swarm_runtime.intake import RetryLater
from swarm_runtime.leader import Lead
from swarm_runtime.records import Conflict, RecordTable
from swarm_runtime.rpc import Refused, ServiceClient
from swarm_runtime.settings import Settings
from swarm_runtime.tasks import cancel_and_wait
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_sweeps.asha import Halving
from swarm_sweeps.searcher import Searcher

log = logging.getLogger("swarm.sweeps")
SERVICE = "sweeps"
# How often every running sweep is checked against its trials' job records.
CHECK_S = 2.0
# A terminal job event that the job record does not show yet is handled again after this.
RECORD_LAG_S = 0.5
PRUNED = "pruned"
REGISTRY_TIMEOUT_S = 10.0


@dataclass
class Live:
    """A running sweep as the leader sees it: its record and its trials' records."""

    record: SweepRecord
    trials: dict[int, TrialRecord] = field(default_factory=dict)
    # Jobs whose cancellation this process already asked for (asked again after a restart).
    cancelling: set[str] = field(default_factory=set)

    @property
    def sweep_id(self) -> str:
        return self.record.sweep_id

    def active(self) -> list[TrialRecord]:
        return [t for t in self.trials.values() if not t.state.terminal]


class Controller:
    def __init__(self, settings: Settings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        # The app gives it the stream consumers only the leader runs.
        self.lead = Lead("sweeps", self._leadership_changed)
        # Set by the app; None for a bare controller.
        self.on_trial_end: Callable[[TrialState], None] | None = None
        self.live: dict[str, Live] = {}
        self.trial_jobs: dict[str, tuple[str, int]] = {}  # job id -> (sweep id, trial)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._task: asyncio.Task[None] | None = None
        self._loaded = False

    @property
    def leading(self) -> bool:
        return self.lead.leading

    # --- start and stop ----------------------------------------------------------------------

    async def prepare(self) -> None:
        js = self.broker.connection.jetstream()
        await ensure_topology(js, self.subjects, self.settings.js_replicas)
        self.sweeps = RecordTable(await kv_bucket(js, self.subjects, "sweeps"), SweepRecord)
        self.trials = RecordTable(await kv_bucket(js, self.subjects, "trials"), TrialRecord)
        self.jobs = RecordTable(await kv_bucket(js, self.subjects, "jobs"), JobRecord)
        self.registry = ServiceClient(
            self.broker.connection, "registry", self.subjects.registry, REGISTRY_TIMEOUT_S
        )
        await self.lead.prepare(js, self.subjects, self.settings.leader_lease_s)

    async def start(self) -> None:
        self.lead.start()
        self._task = asyncio.create_task(self._check_loop())

    async def stop(self) -> None:
        await self.lead.stop()
        await cancel_and_wait([self._task])

    async def _leadership_changed(self, leading: bool) -> None:
        if leading:
            try:
                await self._load()
            except Exception:
                # NATS trouble right at the takeover: the check loop loads again shortly.
                log.exception("could not load the running sweeps; trying again")
                self._loaded = False
        else:
            self.live.clear()
            self.trial_jobs.clear()

    async def _load(self) -> None:
        """The running sweeps and their trials, as KV has them: where the last leader left."""
        self.live.clear()
        self.trial_jobs.clear()
        for record in await self.sweeps.all():
            if record.state.terminal:
                continue
            live = Live(record=record)
            for trial in await self.trials.all(f"{record.sweep_id}.*"):
                live.trials[trial.trial] = trial
                self.trial_jobs[trial.job_id] = (record.sweep_id, trial.trial)
            self.live[record.sweep_id] = live
        # Catch up with what the trials' jobs did while no controller led, before the consumers
        # start and before any new trial is proposed: the searcher is then told every result
        # there is (the job events still unread only confirm what the records say).
        for sweep_id, live in list(self.live.items()):
            async with self._locks[sweep_id]:
                await self._reconcile(live)
        self._loaded = True
        if self.live:
            log.info("leading %d running sweeps", len(self.live))

    # --- what comes in ---------------------------------------------------------------------

    async def submit(self, submission: SweepSubmission, idempotency_key: str) -> None:
        sweep_id = submission.sweep_id or sweep_id_for(submission.tenant, idempotency_key)
        async with self._locks[sweep_id]:
            if await self.sweeps.get(sweep_id) is not None:
                log.info("duplicate submission of %s dropped", sweep_id)
                return
            record = SweepRecord(sweep_id=sweep_id, tenant=submission.tenant, spec=submission.spec)
            await self._emit(
                SweepCreated(sweep_id=sweep_id, tenant=record.tenant, spec=record.spec)
            )
            try:
                await self.sweeps.create(sweep_id, record)
            except Conflict:
                return
            log.info("sweep %s (%s) created", sweep_id, record.spec.name)
            live = self.live[sweep_id] = Live(record=record)
            await self._advance(live)

    async def cancel(self, request: SweepCancelRequest) -> None:
        async with self._locks[request.sweep_id]:
            live = self.live.get(request.sweep_id)
            if live is None or live.record.cancel_requested:
                return

            def change(r: SweepRecord) -> SweepRecord | None:
                if r.state.terminal or r.cancel_requested:
                    return None
                r.cancel_requested, r.reason = True, request.reason
                return r

            await self._write_sweep(live, change)
            await self._advance(live)

    def wants(self, job_id: str) -> bool:
        """Whether ``job_id`` is a trial of a running sweep (other jobs' events are skipped)."""
        return job_id in self.trial_jobs

    async def on_job_event(self, event: AnyJobEvent) -> None:
        found = self.trial_jobs.get(event.job_id)
        if found is None:
            return
        sweep_id, n = found
        async with self._locks[sweep_id]:
            live = self.live.get(sweep_id)
            if live is None or n not in live.trials:
                return
            if isinstance(event, Started):
                await self._started(live, n)
            elif isinstance(event, Validated):
                await self._evaluated(live, n, event)
            elif event.meaning.terminal:
                await self._job_ended(live, n, event.attempt)
            if sweep_id in self.live:
                await self._advance(live)

    # --- the periodic check -----------------------------------------------------------------

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            if not self.leading:
                continue
            if not self._loaded:
                try:
                    await self._load()
                except Exception:
                    log.exception("could not load the running sweeps; trying again")
                    continue
            for sweep_id in list(self.live):
                try:
                    async with self._locks[sweep_id]:
                        live = self.live.get(sweep_id)
                        if live is not None:
                            await self._reconcile(live)
                            if sweep_id in self.live:
                                await self._advance(live)
                except Exception:
                    log.exception("checking sweep %s failed", sweep_id)

    async def _reconcile(self, live: Live) -> None:
        """Catch up with the trials' job records (events missed, or handled by no leader)."""
        for trial in live.active():
            if trial.state == TrialState.pending:
                continue  # _advance submits it
            found = await self.jobs.get(trial.job_id)
            if found is None:
                continue  # not recorded by the scheduler yet
            job = found[0]
            if job.state.terminal:
                await self._trial_ended(live, trial.trial, job)
            elif job.state == JobState.running and trial.state == TrialState.queued:
                await self._started(live, trial.trial)

    # --- moving a sweep forward ---------------------------------------------------------------

    async def _advance(self, live: Live) -> None:
        spec = live.record.spec
        for trial in live.active():
            if trial.state == TrialState.pending:
                await self._submit_trial(live, trial)
        failed = [t for t in live.trials.values() if t.state == TrialState.failed]
        stop: tuple[SweepState, str] | None = None
        if live.record.cancel_requested:
            stop = (SweepState.cancelled, live.record.reason or "cancelled by request")
        elif len(failed) >= spec.max_failed_trials:
            last = max(failed, key=lambda t: t.trial)
            stop = (SweepState.failed, f"{len(failed)} trials failed; the last: {last.reason}")
        if stop is not None:
            active = live.active()
            for trial in active:
                await self._cancel_job(live, trial, f"sweep {stop[0].value}")
            if not active:
                await self._finish(live, *stop)
            return
        while len(live.active()) < spec.max_concurrent and len(live.trials) < spec.trials:
            await self._start_trial(live, len(live.trials))
        if len(live.trials) >= spec.trials and not live.active():
            await self._complete(live)

    async def _start_trial(self, live: Live, n: int) -> None:
        record = live.record
        searcher = Searcher(record.spec)
        # TPE's proposal is CPU work (a few ms to a few hundred with many trials): off the loop.
        proposal = await asyncio.to_thread(searcher.propose, n, list(live.trials.values()))
        trial = TrialRecord(
            sweep_id=record.sweep_id,
            trial=n,
            job_id=trial_job_id(record.tenant, record.sweep_id, n),
            params=proposal.params,
            told=proposal.told,
        )
        try:
            await self.trials.create(trial.key, trial)
        except Conflict:
            # Recorded by another leader meanwhile (an overlap of leases): that one stands.
            found = await self.trials.get(trial.key)
            assert found is not None
            trial = found[0]
        live.trials[n] = trial
        self.trial_jobs[trial.job_id] = (record.sweep_id, n)
        if trial.state == TrialState.pending:
            await self._submit_trial(live, trial)

    async def _submit_trial(self, live: Live, trial: TrialRecord) -> None:
        record = live.record
        try:
            spec = trial_spec(record.spec, trial.params)
        except ValidationError as exc:
            reason = f"parameters make an invalid job spec: {exc.errors()[0]['msg']}"
            await self._trial_over(live, trial.trial, TrialState.failed, reason=reason)
            return
        submission = JobSubmission(
            spec=spec,
            tenant=record.tenant,
            job_id=trial.job_id,
            sweep=SweepRef(id=record.sweep_id, trial=trial.trial),
        )
        event = envelope(SERVICE, "swarm.job.submit", submission, subject=trial.job_id)
        # The job id is the message id: the stream drops a second submission, and the
        # scheduler's create of the job record drops any later one.
        await self.broker.publish(
            event,
            self.subjects.submit,
            stream=self.subjects.submit_stream,
            headers={"Nats-Msg-Id": trial.job_id},
        )
        await self._emit(
            TrialStarted(
                sweep_id=record.sweep_id,
                trial=trial.trial,
                job_id=trial.job_id,
                params=trial.params,
                told=trial.told,
            ),
            trial.trial,
        )
        log.info("sweep %s: trial %d is job %s", record.sweep_id, trial.trial, trial.job_id)
        await self._write_trial(live, trial.trial, _moved(TrialState.pending, TrialState.queued))

    async def _started(self, live: Live, n: int) -> None:
        if live.trials[n].state in (TrialState.pending, TrialState.queued):
            await self._write_trial(live, n, _moved(live.trials[n].state, TrialState.running))

    async def _evaluated(self, live: Live, n: int, event: Validated) -> None:
        spec = live.record.spec
        value = metric_of(event, spec.metric)
        if value is None:
            return  # a validation without the task evals' metric (none ran): nothing to rank
        if live.trials[n].evals.get(event.step) != value:

            def note(t: TrialRecord) -> TrialRecord:
                t.evals[event.step] = value
                return t

            await self._write_trial(live, n, note)
        trial = live.trials[n]
        halving = Halving.of(spec)
        if halving is None or trial.state.terminal or trial.pruned_at_step is not None:
            return
        others = [t.evals for m, t in live.trials.items() if m != n]
        decision = halving.decide(trial.evals, event.step, others)
        if decision is None:
            return
        await self._emit(
            TrialPruned(
                sweep_id=live.sweep_id,
                trial=n,
                job_id=trial.job_id,
                step=decision.step,
                value=decision.value,
                cutoff=decision.cutoff,
            ),
            n,
        )

        def pruned(t: TrialRecord) -> TrialRecord:
            t.pruned_at_step, t.prune_cutoff = decision.step, decision.cutoff
            return t

        await self._write_trial(live, n, pruned)
        log.info(
            "sweep %s: trial %d pruned at step %d (%g, the cut %g)",
            live.sweep_id,
            n,
            decision.step,
            decision.value,
            decision.cutoff,
        )
        await self._cancel_job(live, live.trials[n], PRUNED)

    async def _job_ended(self, live: Live, n: int, attempt: int) -> None:
        """A terminal event of trial ``n``'s job: the job record says how it really ended."""
        found = await self.jobs.get(live.trials[n].job_id)
        if found is None:
            return
        job = found[0]
        if not job.state.terminal:
            if job.attempt > attempt:
                return  # a stale attempt's end (a lost worker's late `failed`): it goes on
            raise RetryLater(RECORD_LAG_S)  # the scheduler has not recorded it yet
        await self._trial_ended(live, n, job)

    async def _trial_ended(self, live: Live, n: int, job: JobRecord) -> None:
        trial = live.trials[n]
        if trial.state.terminal:
            return
        if job.state == JobState.succeeded:
            value = job.metrics.get(live.record.spec.metric)
            if value is None and trial.evals:
                value = trial.evals[max(trial.evals)]
            await self._trial_over(live, n, TrialState.succeeded, value=value, adapter=job.adapter)
        elif job.state == JobState.cancelled:
            pruned = trial.pruned_at_step is not None or job.reason == PRUNED
            state = TrialState.pruned if pruned else TrialState.cancelled
            await self._trial_over(live, n, state, reason=job.reason)
        else:
            await self._trial_over(live, n, TrialState.failed, reason=job.reason)

    async def _trial_over(
        self,
        live: Live,
        n: int,
        state: TrialState,
        *,
        value: float | None = None,
        reason: str | None = None,
        adapter: AdapterRef | None = None,
    ) -> None:
        trial = live.trials[n]
        await self._emit(
            TrialFinished(
                sweep_id=live.sweep_id,
                trial=n,
                job_id=trial.job_id,
                state=state,
                value=value,
                reason=reason,
                adapter=adapter,
            ),
            n,
        )
        if state == TrialState.succeeded and value is not None and math.isfinite(value):
            await self._consider_best(live, trial, value, adapter)

        def over(t: TrialRecord) -> TrialRecord | None:
            if t.state.terminal:
                return None
            t.state, t.value, t.reason = state, value, reason
            t.adapter = adapter
            t.finished_at = utcnow()
            return t

        await self._write_trial(live, n, over)
        log.info("sweep %s: trial %d %s (%s)", live.sweep_id, n, state.value, value)
        if self.on_trial_end is not None:
            self.on_trial_end(state)

    async def _consider_best(
        self, live: Live, trial: TrialRecord, value: float, adapter: AdapterRef | None
    ) -> None:
        previous = live.record.best
        better = previous is None or (
            value < previous.value if live.record.spec.mode == "min" else value > previous.value
        )
        if not better or (previous is not None and previous.trial == trial.trial):
            return
        best = BestTrial(
            trial=trial.trial,
            value=value,
            params=trial.params,
            job_id=trial.job_id,
            adapter=adapter,
        )
        await self._emit(
            BestChanged(sweep_id=live.sweep_id, best=best, previous=previous), trial.trial
        )

        def change(r: SweepRecord) -> SweepRecord:
            r.best = best
            return r

        await self._write_sweep(live, change)

    async def _cancel_job(self, live: Live, trial: TrialRecord, reason: str) -> None:
        if trial.job_id in live.cancelling:
            return
        request = CancelRequest(job_id=trial.job_id, reason=reason)
        await self.broker.publish(
            envelope(SERVICE, "swarm.job.cancel", request, subject=trial.job_id),
            self.subjects.cancel(trial.job_id),
            stream=self.subjects.control_stream,
        )
        live.cancelling.add(trial.job_id)

    # --- the end of a sweep ---------------------------------------------------------------------

    async def _complete(self, live: Live) -> None:
        record = live.record
        best = record.best
        if best is None or best.adapter is None:
            await self._finish(live, SweepState.failed, "no trial succeeded")
            return
        reason = await self._alias_best(record, best.adapter.version)
        counts = Counter(t.state.value for t in live.trials.values())
        await self._emit(SweepCompleted(sweep_id=live.sweep_id, best=best, trials=dict(counts)))
        await self._end(live, SweepState.completed, reason)

    async def _alias_best(self, record: SweepRecord, version: int) -> str | None:
        """Point ``<sweep name>@best`` at ``version``; the reason why not, if it could not be.

        An unreachable registry raises ``Unavailable`` (the sweep completes at a later check);
        a refusal is final and noted on the sweep."""
        request = SetAlias(
            name=record.spec.name, alias=BEST_ALIAS, version=version, tenant=record.tenant
        )
        try:
            await self.registry.call(SET_ALIAS, request)
        except Refused as exc:
            log.warning("sweep %s: alias %s refused: %s", record.sweep_id, BEST_ALIAS, exc)
            return f"could not set alias {BEST_ALIAS}: {exc.message}"
        return None

    async def _finish(self, live: Live, state: SweepState, reason: str) -> None:
        event: SweepEvent
        if state == SweepState.cancelled:
            event = SweepCancelled(sweep_id=live.sweep_id, reason=reason)
        else:
            event = SweepFailed(sweep_id=live.sweep_id, reason=reason)
        await self._emit(event)
        await self._end(live, state, reason)

    async def _end(self, live: Live, state: SweepState, reason: str | None) -> None:
        def change(r: SweepRecord) -> SweepRecord | None:
            if r.state.terminal:
                return None
            r.state, r.reason, r.finished_at = state, reason, utcnow()
            return r

        await self._write_sweep(live, change)
        log.info("sweep %s %s%s", live.sweep_id, state.value, f": {reason}" if reason else "")
        self.live.pop(live.sweep_id, None)
        for trial in live.trials.values():
            self.trial_jobs.pop(trial.job_id, None)

    # --- records and events ---------------------------------------------------------------------

    async def _write_trial(
        self, live: Live, n: int, change: Callable[[TrialRecord], TrialRecord | None]
    ) -> None:
        def stamped(t: TrialRecord) -> TrialRecord | None:
            new = change(t)
            if new is not None:
                new.updated_at = utcnow()
            return new

        written = await self.trials.modify(trial_key(live.sweep_id, n), stamped)
        if written is not None:
            live.trials[n] = written[0]

    async def _write_sweep(
        self, live: Live, change: Callable[[SweepRecord], SweepRecord | None]
    ) -> None:
        def stamped(r: SweepRecord) -> SweepRecord | None:
            new = change(r)
            if new is not None:
                new.updated_at = utcnow()
            return new

        written = await self.sweeps.modify(live.sweep_id, stamped)
        if written is not None:
            live.record = written[0]

    async def _emit(self, event: SweepEvent, trial: int | None = None) -> None:
        # One event of a kind per sweep (per trial for trial events): a controller that does a
        # step again after a crash publishes the same id, which the stream stores once.
        msg_id = f"{event.sweep_id}.{event.event}" + (f".{trial}" if trial is not None else "")
        await self.broker.publish(
            envelope(SERVICE, f"swarm.sweep.{event.event}", event, subject=event.sweep_id),
            self.subjects.sweep_event(event.sweep_id, event.event),
            stream=self.subjects.sweep_events_stream,
            headers={"Nats-Msg-Id": msg_id},
        )


def metric_of(event: Validated, metric: str) -> float | None:
    """The sweep's metric as a validation measured it: its loss, or a task eval's metric."""
    if metric == "eval_loss":
        return event.eval_loss
    if metric == "perplexity":
        return event.perplexity
    return event.evals.metrics.get(metric) if event.evals else None


def _moved(before: TrialState, after: TrialState) -> Callable[[TrialRecord], TrialRecord | None]:
    def change(t: TrialRecord) -> TrialRecord | None:
        if t.state != before:
            return None
        t.state = after
        return t

    return change

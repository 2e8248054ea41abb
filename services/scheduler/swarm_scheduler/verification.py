"""The scheduler's side of verifying untrusted work (docs/providers.md).

A job drawn for verification (``SWARM_VERIFY_FRACTION``, after it succeeded) or asked for
(``swarm.jobs.<id>.verify``) gets a **replay job**: a job record of its own whose ``verify``
names the target attempt and a step range between two of its committed checkpoints. The replay
is placed like any job, except never on the worker that trained the target nor on one of its
provider (``placement.may_replay``). When the replay ends, the outcome goes on the target's
record and into its ``verified`` event; a mismatch marks the target's worker suspect (a
standing instruction in ``worker_ops``, like a cordon) and fails or reruns the target as
``SWARM_VERIFY_POLICY`` says.
"""

from __future__ import annotations

import logging
import random
from typing import Literal, Protocol

from faststream.nats import NatsBroker
from nats.js import JetStreamContext

from swarm_contracts.events import AnyJobEvent, Failed, Queued, Replayed, Requeued, Verified
from swarm_contracts.jobs import JobRecord, JobState, replay_job_id, unverifiable, utcnow
from swarm_contracts.registry import QuarantineJob
from swarm_contracts.registry_api import QUARANTINE_ADAPTER
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import Verification, VerificationOutcome, VerifyTarget
from swarm_contracts.workers import WorkerOps
from swarm_runtime.job_history import past_events
from swarm_runtime.records import Conflict, RecordTable
from swarm_runtime.rpc import Refused, Unavailable
from swarm_scheduler.metrics import SchedulerMetrics
from swarm_scheduler.placement import provider_of
from swarm_scheduler.registry_client import registry_of
from swarm_scheduler.settings import SchedulerSettings
from swarm_scheduler.verdict import Verdict, drawn, judge, pick_range
from swarm_scheduler.view import JobView
from swarm_scheduler.worker_table import WorkerTable

log = logging.getLogger("swarm.scheduler")


async def reported_losses(
    js: JetStreamContext, subjects: Subjects, target: VerifyTarget
) -> dict[int, float]:
    """The losses the target's worker reported (its ``progress`` events of that attempt) for
    the replayed steps, from the job's event history; best effort: any trouble reading it
    leaves the weights as the only evidence."""
    try:
        progress = await past_events(js, subjects, target.job_id, "progress")
    except Exception as exc:
        log.warning("could not read the progress history of %s: %r", target.job_id, exc)
        return {}
    return {
        int(data["step"]): float(data["loss"])
        for data in progress
        if data.get("attempt") == target.attempt
        and target.from_step < int(data.get("step", 0)) <= target.to_step
    }


class Host(Protocol):
    """What verification uses of the scheduler (``swarm_scheduler.scheduler.Scheduler``)."""

    settings: SchedulerSettings
    broker: NatsBroker
    subjects: Subjects
    view: JobView
    workers: WorkerTable
    metrics: SchedulerMetrics | None

    async def emit(self, event: AnyJobEvent) -> None: ...

    def wake(self) -> None: ...


class Verifications:
    def __init__(self, scheduler: Host, rng: random.Random | None = None) -> None:
        self.scheduler = scheduler
        # Not the seedable module RNG: which jobs and ranges are replayed must not be guessable.
        self.rng = rng or random.SystemRandom()
        self.worker_ops: RecordTable[WorkerOps] | None = None  # set by Scheduler.prepare

    async def ended(self, record: JobRecord, event: AnyJobEvent | None = None) -> None:
        """A job reached a terminal state (``event``: the worker's event that ended it)."""
        if record.verify is not None:
            await self._replay_ended(record, event)
        elif record.state == JobState.succeeded and drawn(
            self.scheduler.settings.verify_fraction, self.rng
        ):
            await self.request(record.job_id)

    async def request(self, job_id: str) -> JobRecord | None:
        """Queue a replay of the job's current attempt, once per attempt: the replay job (the
        one queued before, when asked again), or None when the job cannot be verified or its
        verification is done. Asked again (a redelivered request), it also makes a replay that
        a crash left unmade."""
        s = self.scheduler
        target = s.view.open.get(job_id) or await s.view.read(job_id)
        if target is None:
            return None
        if (problem := unverifiable(target)) is not None:
            log.info("not verifying %s: %s", job_id, problem)
            return None
        steps = pick_range(target.checkpoints, self.rng)
        assert steps is not None  # unverifiable() said so
        chosen = Verification(
            replay_job_id=replay_job_id(target.tenant, target.job_id, target.attempt),
            attempt=target.attempt,
            from_step=steps[0],
            to_step=steps[1],
        )

        def mark(r: JobRecord) -> JobRecord | None:
            # First on the target: the registry keeps the checkpoints of a job whose
            # verification is pending.
            if r.attempt != target.attempt or unverifiable(r) is not None:
                return None
            if r.verification is not None and r.verification.attempt == r.attempt:
                return None  # chosen before: that range it is
            r.verification = chosen
            return r

        marked = await s.view.modify(job_id, mark) or await s.view.read(job_id)
        v = marked.verification if marked is not None else None
        if v is None or v.attempt != target.attempt or v.outcome != "pending":
            return None
        assert target.worker_id is not None  # unverifiable() said so
        worker = s.workers.info(target.worker_id)
        verify = VerifyTarget(
            job_id=target.job_id,
            attempt=target.attempt,
            worker_id=target.worker_id,
            provider=provider_of(worker) if worker else None,
            from_step=v.from_step,
            to_step=v.to_step,
        )
        replay = JobRecord(
            job_id=v.replay_job_id,
            tenant=target.tenant,
            spec=target.spec,
            base_model=target.base_model,
            parent=target.parent,
            memory=target.memory,
            trace_parent=target.trace_parent,
            verify=verify,
        )
        try:
            await s.view.create(replay)
        except Conflict:
            return await s.view.read(replay.job_id)
        log.info(
            "verifying %s attempt %d (worker %s): replaying steps %d→%d as %s",
            job_id,
            target.attempt,
            target.worker_id,
            verify.from_step,
            verify.to_step,
            replay.job_id,
        )
        await s.emit(Queued(job_id=replay.job_id, tenant=replay.tenant, spec=replay.spec))
        s.wake()
        return replay

    async def _judge(
        self, replay: JobRecord, target: VerifyTarget, event: AnyJobEvent | None
    ) -> tuple[VerificationOutcome, str, Verdict | None]:
        """How the replay came out: matched (passed) or not (failed), or could not be done."""
        s = self.scheduler
        if not (isinstance(event, Replayed) and replay.state == JobState.succeeded):
            reason = f"the replay {replay.state.value}: {replay.reason or 'no reason given'}"
            return "error", reason, None
        losses = await reported_losses(s.broker.connection.jetstream(), s.subjects, target)
        settings = s.settings
        verdict = judge(
            event.report, losses, settings.verify_tolerance, settings.verify_loss_tolerance
        )
        return ("passed" if verdict.passed else "failed"), verdict.reason, verdict

    async def _replay_ended(self, replay: JobRecord, event: AnyJobEvent | None) -> None:
        s, target = self.scheduler, replay.verify
        assert target is not None
        settings = s.settings
        outcome, reason, verdict = await self._judge(replay, target, event)
        failed = outcome == "failed"
        rerun = failed and settings.verify_policy == "rerun"

        def settle(r: JobRecord) -> JobRecord | None:
            v = r.verification
            if v is None or v.replay_job_id != replay.job_id or v.outcome != "pending":
                return None
            r.verification = v.model_copy(update={"outcome": outcome, "reason": reason})
            if not failed or r.attempt != target.attempt or r.state != JobState.succeeded:
                return r
            if rerun:
                # Again from the start on another worker: not from the failed worker's
                # checkpoints, nor keeping its adapter as the job's.
                r.state, r.reason = JobState.queued, f"requeued: verification failed: {reason}"
                r.worker_id = r.assigned_at = r.adapter = None
                r.resume_after_attempt, r.checkpoints, r.metrics = r.attempt, [], {}
            else:
                r.state, r.reason = JobState.failed, f"verification failed: {reason}"
            return r

        settled = await s.view.modify(target.job_id, settle)
        if settled is None:
            # Settled already (a redelivered event: perhaps the first delivery's scheduler
            # died before the quarantine below), or the target is gone.
            current = s.view.open.get(target.job_id) or await s.view.read(target.job_id)
            v = current.verification if current is not None else None
            if v is not None and v.replay_job_id == replay.job_id and v.outcome == "failed":
                await self.quarantine(target.job_id, v.reason or "its verification failed")
            return
        job_steps = replay.spec.training.max_steps
        action = _action(failed, settled)
        if s.metrics is not None:
            s.metrics.verified(outcome, target.steps, job_steps)
        log.log(
            logging.WARNING if failed else logging.INFO,
            "verification of %s attempt %d (worker %s) %s: %s",
            target.job_id,
            target.attempt,
            target.worker_id,
            outcome,
            reason,
        )
        if failed:
            await self.suspect(target.worker_id, f"replay of {target.job_id}: {reason}")
            await self.quarantine(target.job_id, reason)
            await self._apply_policy(settled, action, reason)
        # Last: whoever follows the job's events knows, when it comes, what became of the job.
        await s.emit(
            Verified(
                job_id=target.job_id,
                attempt=target.attempt,
                outcome=outcome,
                reason=reason,
                replay_job_id=replay.job_id,
                worker_id=target.worker_id,
                replay_worker_id=replay.worker_id,
                from_step=target.from_step,
                to_step=target.to_step,
                max_relative_l2=verdict.max_relative_l2 if verdict else None,
                worst_matrix=verdict.worst_matrix if verdict else None,
                max_loss_difference=verdict.max_loss_difference if verdict else None,
                tolerance=settings.verify_tolerance,
                loss_tolerance=settings.verify_loss_tolerance,
                replayed_steps=target.steps,
                job_steps=job_steps,
                overhead=target.steps / job_steps,
                action=action,
                policy=settings.verify_policy,
            )
        )

    async def _apply_policy(self, target: JobRecord, action: str, reason: str) -> None:
        """The events of what the policy did to the job (its record says it already)."""
        s = self.scheduler
        if action == "rerun":
            await s.emit(Requeued(job_id=target.job_id, attempt=target.attempt, reason=reason))
            s.wake()
        elif action == "failed":
            reason = target.reason or reason
            await s.emit(Failed(job_id=target.job_id, attempt=target.attempt, reason=reason))

    async def quarantine(self, job_id: str, reason: str) -> None:
        """Have the registry quarantine the adapter version the job made: not served, aliased,
        continued from or the latest until an admin clears it. A job that made none (it
        registered nothing) is no error; an unreachable registry is logged, and the job's
        verified event still says what happened."""
        s = self.scheduler
        request = QuarantineJob(job_id=job_id, reason=f"verification failed: {reason}")
        try:
            version = await registry_of(s.broker, s.subjects).call(QUARANTINE_ADAPTER, request)
        except Refused as exc:
            if exc.code != "not_found":
                log.error("could not quarantine the adapter of %s: %s", job_id, exc.message)
            return
        except Unavailable as exc:
            log.error("could not quarantine the adapter of %s: %s", job_id, exc)
            return
        log.warning("quarantined %s v%d, made by %s", version.name, version.version, job_id)

    async def suspect(self, worker_id: str, reason: str) -> None:
        """Mark the worker suspect in ``worker_ops``, keeping any cordon or drain it has."""
        assert self.worker_ops is not None, "prepare() first"

        def change(ops: WorkerOps) -> WorkerOps:
            ops.suspect, ops.suspect_reason, ops.updated_at = True, reason[:500], utcnow()
            return ops

        if await self.worker_ops.modify(worker_id, change) is not None:
            return
        try:
            await self.worker_ops.create(worker_id, change(WorkerOps(worker_id=worker_id)))
        except Conflict:  # an operator's instruction came meanwhile: add to it
            await self.worker_ops.modify(worker_id, change)


def _action(failed: bool, target: JobRecord) -> Literal["none", "failed", "rerun"]:
    """What became of the job after its verification (its settled record says)."""
    if failed and target.state == JobState.queued:
        return "rerun"
    if failed and target.state == JobState.failed:
        return "failed"
    return "none"

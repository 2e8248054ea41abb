"""An attempt's adapter registered: its lineage, and a version asked of the registry.

The request goes on this worker's own subject: the registry registers only for the worker that
holds the job's current attempt (and checks the attempt's token), so a stale copy of a job can
register nothing. It is retried while the registry is unreachable (idempotent per job).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from faststream.nats import NatsBroker
from opentelemetry.trace import Tracer
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from swarm_contracts.jobs import utcnow
from swarm_contracts.registry import AdapterVersion, Lineage, RegisterAdapter
from swarm_contracts.registry_api import REGISTER_ADAPTER
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Assignment
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable
from swarm_trainer.job_history import workers_that_ran

if TYPE_CHECKING:
    # torch: imported by the run, not by the agent at start-up.
    from swarm_trainer.train_state import TrainMetrics

REGISTER_TIMEOUT_S = 60.0


class RegistrationError(RuntimeError):
    pass


class Worker(Protocol):
    """What registration uses of the worker (``swarm_trainer.agent.TrainerAgent``)."""

    broker: NatsBroker
    subjects: Subjects
    worker_id: str
    # The provider this worker is (``swarm-trainer join``), or None for the cluster's own.
    provider: str | None
    tracer: Tracer


async def trainers(worker: Worker, job: Assignment) -> list[str]:
    """The workers that trained ``job`` up to this attempt, ending with this one."""
    if worker.provider is not None:
        # A provider may not read job events (other tenants' jobs are none of its business):
        # its lineage names itself; the job's events name the others.
        return [worker.worker_id]
    js = worker.broker.connection.jetstream()
    return await workers_that_ran(js, worker.subjects, job.job_id, job.attempt, worker.worker_id)


def lineage(
    job: Assignment,
    metrics: TrainMetrics,
    *,
    worker_id: str,
    worker_ids: list[str],
    started_at: datetime,
) -> Lineage:
    """Where the adapter came from: the job's inputs and settings, what the run measured, the
    workers that trained it (``worker_ids``, ending with ``worker_id``, this one)."""
    return Lineage(
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
        metrics=metrics.event_metrics(),
        eval_history=[e.figures() for e in metrics.eval_history],
        best_step=metrics.best_step,
        worker_id=worker_id,
        worker_ids=worker_ids,
        started_at=started_at,
        finished_at=utcnow(),
        parent=job.parent.ref if job.parent else None,
        forked_from=job.fork.ref if job.fork else None,
    )


async def register(worker: Worker, request: RegisterAdapter) -> AdapterVersion:
    """The adapter's new version, in a ``trainer.register`` span (the registry's spans are its
    children: the request carries it)."""
    attributes = {"swarm.job_id": request.lineage.job_id, "swarm.adapter": request.name}
    with worker.tracer.start_as_current_span("trainer.register", attributes=attributes):
        return await _register(worker, request)


async def _register(worker: Worker, request: RegisterAdapter) -> AdapterVersion:
    registry = ServiceClient(
        worker.broker.connection,
        "registry",
        lambda action: worker.subjects.worker_registry(action, worker.worker_id),
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

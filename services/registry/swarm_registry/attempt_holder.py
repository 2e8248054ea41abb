"""Whether a worker's request may act for a job: it must hold the job's current attempt.

Adapter registrations and store-access grants come from workers, some of them untrusted
providers. Each request names a job, an attempt and the attempt's token; the job record is the
authority. A request is accepted only when the attempt is the record's current one, the token
is that attempt's, and, where the sender's worker id is known (its subject carries it), the
sender is the worker the record assigned the attempt to. A registration may further only make
the job's own adapter (its tenant, its name, its inputs) from the attempt's own output prefix:
a provider must not register into another tenant, nor copy anything else (a dataset, another
job's output) into an adapter.

Each check is a pure function of (request, job record, sender worker id), so that whichever
subject a request arrives on, its handler asks the same question.
"""

from __future__ import annotations

from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.layout import output_prefix
from swarm_contracts.providers import token_matches
from swarm_contracts.registry import RegisterAdapter
from swarm_contracts.sessions import SessionLease
from swarm_contracts.store_access import StoreAccess, within
from swarm_registry.errors import RegistryError

# A store grant is for an attempt that may still use the store (running, or about to): a job
# that ended or moved on has nothing more to read or write.
_ACTIVE = (JobState.assigned, JobState.running)


def _forbidden(message: str) -> RegistryError:
    return RegistryError(message, "forbidden")


def _check_sender(record: JobRecord, sender_worker_id: str | None) -> None:
    if sender_worker_id is not None and sender_worker_id != record.worker_id:
        raise _forbidden(
            f"job {record.job_id!r} attempt {record.attempt} is not assigned to worker "
            f"{sender_worker_id!r}"
        )


def check_registration(
    request: RegisterAdapter, record: JobRecord | None, sender_worker_id: str | None
) -> None:
    """Raise unless ``request`` may register an adapter version for its job.

    ``record`` is the job's record (None: there is none); ``sender_worker_id`` is the worker
    that sent the request, when its subject says so (None: a trusted service's subject).
    """
    lineage = request.lineage
    if record is None:
        # Registrations outside the scheduler (imports, tests) have no record; a worker's never.
        if sender_worker_id is not None:
            raise _forbidden(
                f"no job {lineage.job_id!r}: worker {sender_worker_id!r} registers only "
                "the adapter of a job assigned to it"
            )
        _check_source(request)
        return
    if record.attempt != lineage.attempt:
        raise RegistryError(
            f"stale attempt: job {record.job_id!r} is at attempt {record.attempt}, "
            f"not {lineage.attempt}; this worker's result is not registered",
            "conflict",
        )
    if not token_matches(record.attempt_token_sha256, request.attempt_token):
        raise _forbidden(
            f"job {record.job_id!r} attempt {lineage.attempt} is not this worker's: "
            "no adapter registered"
        )
    _check_sender(record, sender_worker_id)
    if record.verify is not None:
        raise _forbidden(f"job {record.job_id!r} is a replay: it makes no adapter")
    _check_source(request)
    mismatches = _lineage_mismatches(request, record)
    if mismatches:
        raise _forbidden(
            f"job {record.job_id!r} makes {record.tenant}'s adapter {record.spec.name!r}: "
            + "; ".join(mismatches)
        )


def _check_source(request: RegisterAdapter) -> None:
    """An adapter is made only from what its attempt wrote. Nobody but the attempt (or a
    holder of store keys) can write there, so a made-up job id brings nothing to copy, and no
    dataset or other job's output can become an adapter."""
    lineage = request.lineage
    source = output_prefix(lineage.job_id, lineage.attempt)
    if not within(request.store_key, source):
        raise _forbidden(
            f"an adapter of job {lineage.job_id!r} attempt {lineage.attempt} is registered "
            f"from its own output ({source}/), not from {request.store_key!r}"
        )


def _lineage_mismatches(request: RegisterAdapter, record: JobRecord) -> list[str]:
    """What the request claims that the job record contradicts (empty: nothing)."""
    lineage = request.lineage
    claims = [
        ("tenant", lineage.tenant, record.tenant),
        ("adapter name", request.name, record.spec.name),
        ("dataset", lineage.dataset, record.spec.dataset),
        ("validation dataset", lineage.validation_dataset, record.spec.validation),
        ("parent", lineage.parent, record.parent.ref if record.parent else None),
        ("checkpoint", lineage.forked_from, record.fork.ref if record.fork else None),
    ]
    if record.base_model is not None:
        claims.append(
            (
                "base model",
                f"{lineage.base_model}@{lineage.base_model_version}",
                f"{record.base_model.name}@{record.base_model.version}",
            )
        )
    return [
        f"{what} {claimed!r} is not the job's {actual!r}"
        for what, claimed, actual in claims
        if claimed != actual
    ]


def check_store_access(
    request: StoreAccess, record: JobRecord | None, sender_worker_id: str | None
) -> JobRecord:
    """The job's record, if ``request``'s sender holds the job's current, active attempt.

    Unlike registrations, a job without a record gets nothing: without one there is no scope.
    A record without an attempt token (placed before tokens existed) gets nothing either:
    anyone knowing the job id could otherwise read its data."""
    if record is None:
        raise _forbidden(f"no job {request.job_id!r} to grant store access for")
    if record.attempt != request.attempt or record.state not in _ACTIVE:
        raise RegistryError(
            f"stale attempt: job {request.job_id!r} is at attempt {record.attempt} "
            f"({record.state}), not {request.attempt}: no store access",
            "conflict",
        )
    if record.attempt_token_sha256 is None or not token_matches(
        record.attempt_token_sha256, request.attempt_token
    ):
        raise _forbidden(f"job {request.job_id!r} attempt {request.attempt} is not this worker's")
    _check_sender(record, sender_worker_id)
    return record


def check_session_access(
    request: StoreAccess, lease: SessionLease | None, sender_worker_id: str | None
) -> SessionLease:
    """The training session's lease, if ``request``'s sender holds it now: the lease is held
    (not ended), at the request's attempt, with that attempt's token (which only the worker
    given the session's ``create`` call received), by the sender."""
    if lease is None or lease.attempt_token_sha256 is None:
        # A lease without a token was made before tokens: nothing to check a request against.
        raise _forbidden(f"no training session {request.job_id!r} to grant store access for")
    if lease.attempt != request.attempt or lease.state != "held":
        raise RegistryError(
            f"stale attempt: session {request.job_id!r} is at attempt {lease.attempt} "
            f"({lease.state}), not {request.attempt}: no store access",
            "conflict",
        )
    if not token_matches(lease.attempt_token_sha256, request.attempt_token):
        raise _forbidden(
            f"session {request.job_id!r} attempt {request.attempt} is not this worker's"
        )
    if sender_worker_id is not None and sender_worker_id != lease.worker_id:
        raise _forbidden(
            f"session {request.job_id!r} attempt {lease.attempt} is not held by worker "
            f"{sender_worker_id!r}"
        )
    return lease

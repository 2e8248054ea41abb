"""Scoped object-store access: what a worker without store keys asks the registry for.

A provider's trainer agent holds no store credentials. For every store operation it asks the
registry (``swarm.registry.store.access``) with its assignment's attempt token; the registry
checks the token against the job record and the key against the job's scope
(``job_scope``), and answers with a presigned URL good for one object and one method for a few
minutes, or for ``list``/``head`` with the answer itself (docs/providers.md, *Store access*).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from swarm_contracts.jobs import JobRecord
from swarm_contracts.layout import (
    OUTPUTS,
    job_checkpoints,
    join_key,
    output_prefix,
    resume_key,
    run_key,
    session_saves,
)
from swarm_contracts.sessions import SessionLease

StoreOp = Literal["get", "put", "delete", "head", "list"]
READ_OPS: tuple[StoreOp, ...] = ("get", "head", "list")
WRITE_OPS: tuple[StoreOp, ...] = ("put", "delete")


class StoreAccess(BaseModel):
    """``swarm.registry.store.access``: one operation on one key (``list``: a prefix)."""

    job_id: str = Field(description="the job's id, or a training session's token (its lease)")
    attempt: int
    attempt_token: str = Field(repr=False, description="the assignment's attempt token")
    op: StoreOp
    key: str = Field(description="the object's key; for list, a prefix")


class StoredObject(BaseModel):
    key: str
    size: int


class StoreGrant(BaseModel):
    """The registry's answer: a presigned ``url`` for ``method`` (get, put, delete), or the
    answer itself (``head``: ``objects`` holds the object, or nothing when it does not exist;
    ``list``: every object below the prefix, sorted)."""

    op: StoreOp
    key: str
    method: str | None = None
    url: str | None = Field(default=None, repr=False)
    expires_at: datetime | None = None
    objects: list[StoredObject] = Field(default_factory=list)


class JobScope(NamedTuple):
    """What one attempt of a job (or of a training session) may touch: ``read`` keys or
    prefixes (a prefix covers every key below it), and ``write`` prefixes (put and delete);
    ``write_like``: write prefixes named by a pattern (a session's sampler saves, one output
    per call). Writes are readable too."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    write_like: tuple[str, ...] = ()

    def allows(self, op: StoreOp, key: str) -> bool:
        roots = self.write if op in WRITE_OPS else self.read + self.write
        roots += tuple(m.group(0) for p in self.write_like if (m := re.match(p, key)))
        if op == "list":
            # S3 prefixes are plain string prefixes: "checkpoints/job-a" would also list
            # "checkpoints/job-ab/…". A listing must name a directory below a root.
            return any(key.startswith(root.rstrip("/") + "/") for root in roots)
        return any(within(key, root) for root in roots)


def within(key: str, root: str) -> bool:
    """``key`` is ``root`` (a dataset's key is a root) or below it; ``rootX`` is not."""
    root = root.rstrip("/")
    return key == root or key.startswith(root + "/")


def job_scope(
    record: JobRecord, dataset_keys: list[str], token_roots: Sequence[str] = ()
) -> JobScope:
    """The scope of the record's current attempt.

    Read: its datasets (the gateway's ``DatasetInfo.store_key`` of the spec's dataset and
    validation set, which the caller looks up), the token cache of its training set
    (``token_roots``: ``layout.tokens_of_dataset``; never written by such a worker, whose
    tokens would go unchecked into other jobs), its pinned base model's files, its parent
    adapter's files, and all of the job's checkpoints (a new attempt resumes from an earlier
    attempt's). Write: only this attempt's own Ray run, its resume copy and its outputs, so a
    worker can neither change another job's files nor an earlier attempt's checkpoints.
    """
    read = [*dataset_keys, *token_roots, job_checkpoints(record.job_id)]
    if record.base_model is not None:
        read.append(record.base_model.store_key)
    if record.parent is not None:
        read.append(record.parent.store_key)
    if record.verify is not None:
        read.append(job_checkpoints(record.verify.job_id))
    write = (
        run_key(record.job_id, record.attempt),
        resume_key(record.job_id, record.attempt),
        output_prefix(record.job_id, record.attempt),
    )
    return JobScope(read=tuple(read), write=write)


def session_scope(lease: SessionLease) -> JobScope:
    """The scope of a training session's lease (docs/tinker.md, *Placement*).

    Read: its base model's files and its tenant's Tinker saves (``load_state`` and
    ``create_training_client_from_state`` may name any model's save of the tenant). Write: its
    own saves, and the outputs its ``save_weights_for_sampler`` calls write for the registry
    (``outputs/<session>-s<seq_id>/1``). Nothing of another tenant's, nor of any job's."""
    read = [session_saves(lease.tenant)]
    if lease.base_model is not None:
        read.append(lease.base_model.store_key)
    sampler_outputs = rf"{re.escape(join_key(OUTPUTS, lease.session))}-s[0-9]+/1"
    return JobScope(
        read=tuple(read),
        write=(session_saves(lease.tenant, lease.session),),
        write_like=(sampler_outputs,),
    )

"""``from_checkpoint``: pinning a committed checkpoint of one job for another job to start from.

The registry holds the store keys and reads the job records, so it is the one to check that the
checkpoint is the tenant's and committed (Ray Train's snapshot of the run lists it), and to
copy it where the new job keeps its own checkpoints (``layout.fork_key``): the copy lives as
long as the new job, whatever happens to the source's run (Ray prunes all but its last few
checkpoints; retention removes a finished job's). A provider's trainer may read its own job's
checkpoints only, which the copy is among. The copy counts only if the source is still listed
once it is complete: Ray drops a checkpoint from its snapshot before deleting its files.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from swarm_contracts.jobs import ForkPoint, JobRecord, parse_checkpoint_ref
from swarm_contracts.layout import (
    checkpoint_dir_name,
    checkpoint_prefix,
    committed_dir_names,
    fork_key,
    join_key,
    snapshot_key,
)
from swarm_contracts.registry import ForkCheckpoint, ForkSource
from swarm_registry.errors import RegistryError
from swarm_runtime.records import RecordTable
from swarm_runtime.store import NotFound, ObjectStore

# Written last into the copy: the pinned point, so that asking again answers the same.
FORK_MARKER = "swarm_fork.json"
# What the trainer loads the starting weights from (PEFT layout), hashed when pinned.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SNAPSHOT_READ_TRIES = 10
COPY_TRIES = 5


class Forks:
    def __init__(self, store: ObjectStore, jobs: RecordTable[JobRecord]) -> None:
        self.store = store
        self.jobs = jobs

    async def fork(self, request: ForkCheckpoint) -> ForkSource:
        source_id, step = parse_checkpoint_ref(request.source)
        found = await self.jobs.get(source_id)
        record = found[0] if found is not None else None
        # Another tenant's job is as unknown as a missing one; a replay is no job of theirs.
        if record is None or record.tenant != request.tenant or record.verify is not None:
            raise RegistryError(
                f"job {source_id} not found for tenant {request.tenant}", "not_found"
            )
        if request.job_id is None and not request.dry_run:
            raise RegistryError("a fork names the job it is for (job_id)", "invalid")
        if source_id == request.job_id:
            raise RegistryError(f"job {source_id} cannot start from its own checkpoint", "invalid")
        if record.base_model is None or record.attempt == 0:
            raise RegistryError(f"job {source_id} never ran: it has no checkpoints", "conflict")
        point = await asyncio.to_thread(pin, self.store, record, step, request)
        return ForkSource(fork=point, base_model=record.base_model, lora=record.spec.lora)


def pin(store: ObjectStore, record: JobRecord, step: int, request: ForkCheckpoint) -> ForkPoint:
    """The checkpoint of ``record``'s job at ``step`` pinned for ``request.job_id`` (on a dry
    run: found, and left where it is)."""
    target = fork_key(request.job_id) if request.job_id and not request.dry_run else None
    if target is not None:
        pinned = _pinned(store, target)
        if pinned is not None and pinned.ref == request.source:
            return pinned.model_copy(update={"optimizer": request.optimizer})
    for _ in range(COPY_TRIES):
        attempt = committed_attempt(store, record, step)
        if attempt is None:
            raise RegistryError(
                f"job {record.job_id} has no committed checkpoint at step {step} (a run keeps "
                "its last two; a finished job's are removed by the garbage collector): see "
                "its checkpoints",
                "conflict",
            )
        source = checkpoint_prefix(record.job_id, attempt, step)
        point = ForkPoint(
            job_id=record.job_id,
            attempt=attempt,
            step=step,
            store_key=source,
            optimizer=request.optimizer,
        )
        if target is None:  # a dry run
            return point
        try:
            files = store.copy_prefix(source, target)
        except NotFound:
            continue  # pruned while we looked: look again
        if not _listed(store, record.job_id, attempt, step):
            continue  # pruned while we copied: what we have may be partial
        missing = [name for name in ADAPTER_FILES if name not in files]
        if missing:
            raise RegistryError(
                f"the checkpoint {request.source} has no {', '.join(missing)}", "conflict"
            )
        point = point.model_copy(
            update={"store_key": target, "files": {n: files[n] for n in ADAPTER_FILES}}
        )
        store.put_bytes(join_key(target, FORK_MARKER), point.model_dump_json().encode())
        return point
    raise RegistryError(
        f"the checkpoint {request.source} kept vanishing while it was copied", "conflict"
    )


def committed_attempt(store: ObjectStore, record: JobRecord, step: int) -> int | None:
    """The newest attempt of the job whose run lists a committed checkpoint at ``step``."""
    for attempt in range(record.attempt, 0, -1):
        if _listed(store, record.job_id, attempt, step):
            return attempt
    return None


def _listed(store: ObjectStore, job_id: str, attempt: int, step: int) -> bool:
    return checkpoint_dir_name(step) in committed_dir_names(_snapshot(store, job_id, attempt))


def _snapshot(store: ObjectStore, job_id: str, attempt: int) -> dict[str, Any]:
    key = snapshot_key(job_id, attempt)
    for _ in range(SNAPSHOT_READ_TRIES):
        try:
            found = json.loads(store.get_bytes(key))
            return found if isinstance(found, dict) else {}
        except NotFound:
            return {}
        except ValueError:
            # Ray rewrites the file in place (truncate, write): caught mid-write, read again.
            time.sleep(0.2)
    raise RegistryError(f"{key}: unreadable", "internal")


def _pinned(store: ObjectStore, target: str) -> ForkPoint | None:
    try:
        return ForkPoint.model_validate_json(store.get_bytes(join_key(target, FORK_MARKER)))
    except NotFound:
        return None

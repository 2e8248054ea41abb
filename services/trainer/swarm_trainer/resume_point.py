"""Where an attempt starts, read from the store: the checkpoints a job's runs committed, the
copy a new attempt resumes from, the checkpoint a replay starts at.

Apart from ``checkpoint`` (what a checkpoint directory holds, written by the ranks with torch)
because the agent asks these before any rank runs, and imports neither torch nor peft for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarm_contracts.layout import (
    checkpoint_dir_name,
    checkpoint_prefix,
    join_key,
    resume_key,
    run_key,
    snapshot_key,
)
from swarm_contracts.verification import VerifyTarget
from swarm_runtime.store import NotFound, ObjectStore

# Ray's snapshot (``layout.snapshot_key``) lists the checkpoints a run committed: a directory
# it does not list may be a half-written upload (a worker died while uploading it), and
# ``get_checkpoint`` never returns it.
SNAPSHOT_READ_TRIES = 10
# Written last into a resume copy: the copy is complete and was committed when copied.
RESUME_MARKER = "swarm_resume.json"
RESUME_TRIES = 5


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResumePoint:
    step: int
    key: str  # the store prefix of a complete checkpoint directory


def _snapshot(store: ObjectStore, job_id: str, attempt: int) -> dict[str, Any]:
    key = snapshot_key(job_id, attempt)
    for _ in range(SNAPSHOT_READ_TRIES):
        try:
            return json.loads(store.get_bytes(key))
        except NotFound:
            return {}
        except ValueError:
            # Ray rewrites the file in place (truncate, write): caught mid-write, read again.
            time.sleep(0.2)
    raise CheckpointError(f"{key}: unreadable")


def _latest(snapshot: dict[str, Any]) -> str | None:
    name = (snapshot.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name") or ""
    return name if name.startswith("checkpoint_") else None


def _listed(snapshot: dict[str, Any], dir_name: str) -> bool:
    results = snapshot.get("checkpoint_results") or []
    return dir_name == _latest(snapshot) or any(
        r.get("checkpoint_dir_name") == dir_name for r in results
    )


def _step(dir_name: str) -> int:
    return int(dir_name.rsplit("_", 1)[-1])


def committed_checkpoint_step(store: ObjectStore, job_id: str, attempt: int) -> int:
    """The step of the latest checkpoint ``attempt``'s run committed (0: none), from Ray's
    snapshot: a directory that merely exists may be a half-written upload."""
    name = _latest(_snapshot(store, job_id, attempt))
    return _step(name) if name else 0


def wait_committed(
    store: ObjectStore,
    job_id: str,
    attempt: int,
    step: int,
    timeout_s: float = 60.0,
    give_up: Callable[[], bool] = lambda: False,
) -> bool:
    """Until ``attempt``'s run has committed a checkpoint at ``step`` or later. Ray registers a
    reported checkpoint asynchronously (its controller polls the workers), so ``report``
    returning does not mean a new attempt could resume from it yet. ``give_up``: asked between
    polls; True ends the wait at once (the attempt is over, nobody needs the answer)."""
    deadline = time.monotonic() + timeout_s
    while committed_checkpoint_step(store, job_id, attempt) < step:
        if time.monotonic() > deadline or give_up():
            return False
        time.sleep(0.1)
    return True


def replay_start(store: ObjectStore, target: VerifyTarget) -> ResumePoint:
    """Where a replay starts: the target's checkpoint at ``from_step``, used in place (the
    target has ended, and the registry keeps a job's checkpoints while it is verified). Both
    ends must be committed checkpoints of the target's run, not merely directories."""
    snapshot = _snapshot(store, target.job_id, target.attempt)
    for step in (target.from_step, target.to_step):
        if not _listed(snapshot, checkpoint_dir_name(step)):
            raise CheckpointError(
                f"{target.job_id} attempt {target.attempt} has no committed checkpoint at "
                f"step {step} to replay"
            )
    return ResumePoint(
        step=target.from_step,
        key=checkpoint_prefix(target.job_id, target.attempt, target.from_step),
    )


def prepare_resume(
    store: ObjectStore, job_id: str, attempt: int, after: int = 0
) -> ResumePoint | None:
    """Where ``attempt`` starts: the latest checkpoint any earlier attempt (after attempt
    ``after``: a rerun does not trust those before) committed, copied to
    ``resume_key`` first (idempotent). The copy counts only if the source is still listed after
    it is complete: Ray drops a checkpoint from its snapshot before deleting its files, so an
    earlier attempt still running (frozen, then woken up) cannot prune it under us."""
    target = resume_key(job_id, attempt)
    try:
        marker = json.loads(store.get_bytes(join_key(target, RESUME_MARKER)))
        return ResumePoint(step=int(marker["step"]), key=target)
    except NotFound:
        pass
    for _ in range(RESUME_TRIES):
        candidates = []
        for earlier in range(after + 1, attempt):
            name = _latest(_snapshot(store, job_id, earlier))
            if name is not None:
                candidates.append((_step(name), earlier, name))
        if not candidates:
            return None
        # The furthest step; of equal ones the newest attempt, the least likely to be stale.
        step, source_attempt, name = max(candidates)
        source = join_key(run_key(job_id, source_attempt), name)
        try:
            store.copy_prefix(source, target)
        except NotFound:
            continue  # pruned while we looked: pick again
        if _listed(_snapshot(store, job_id, source_attempt), name):
            marker = {"step": step, "source": source}
            store.put_bytes(join_key(target, RESUME_MARKER), json.dumps(marker).encode())
            return ResumePoint(step=step, key=target)
    raise CheckpointError(f"{job_id}: checkpoints keep vanishing while copied for a resume")

"""Which checkpoint a new attempt starts from, read from Ray's snapshots in the store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from swarm_contracts.layout import checkpoint_dir_name, resume_key, run_key, snapshot_key
from swarm_contracts.verification import VerifyTarget
from swarm_runtime.store import LocalStore
from swarm_trainer.checkpoint import ADAPTER_FILE
from swarm_trainer.resume_point import (
    CheckpointError,
    committed_checkpoint_step,
    prepare_resume,
    replay_start,
    wait_committed,
)


def commit(store: LocalStore, job_id: str, attempt: int, *steps: int) -> None:
    """Checkpoint directories of ``attempt``'s run and Ray's snapshot listing them."""
    names = [checkpoint_dir_name(s) for s in steps]
    for name in names:
        store.put_bytes(f"{run_key(job_id, attempt)}/{name}/{ADAPTER_FILE}", name.encode())
    snapshot = {
        "checkpoint_results": [{"checkpoint_dir_name": n} for n in names],
        "latest_checkpoint_result": {"checkpoint_dir_name": names[-1]},
    }
    store.put_bytes(snapshot_key(job_id, attempt), json.dumps(snapshot).encode())


def test_a_new_attempt_copies_the_latest_committed_checkpoint_of_earlier_attempts(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    assert prepare_resume(store, "job-1", 1) is None
    commit(store, "job-1", 1, 3, 6)
    commit(store, "job-1", 2, 9)
    # Half-written: in the run directory, but not in Ray's snapshot.
    store.put_bytes(f"{run_key('job-1', 2)}/{checkpoint_dir_name(12)}/{ADAPTER_FILE}", b"x")

    point = prepare_resume(store, "job-1", 3)
    assert point is not None
    assert point.step == 9
    assert point.key == resume_key("job-1", 3)
    assert store.get_bytes(f"{point.key}/{ADAPTER_FILE}") == checkpoint_dir_name(9).encode()
    # Asked again (a retried start), the same copy, even after the source is gone.
    store.delete_prefix(run_key("job-1", 2) + "/")
    assert prepare_resume(store, "job-1", 3) == point
    assert committed_checkpoint_step(store, "job-1", 1) == 6
    assert committed_checkpoint_step(store, "job-1", 2) == 0


def test_waiting_for_a_commit_ends_when_it_is_there_or_when_told_to_give_up(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    commit(store, "job-1", 1, 2)
    assert wait_committed(store, "job-1", 1, 2, timeout_s=0)
    started = time.monotonic()
    # Step 4 never comes: a superseded run's agent stops waiting at once, not after a minute.
    assert not wait_committed(store, "job-1", 1, 4, timeout_s=60, give_up=lambda: True)
    assert time.monotonic() - started < 5


def test_a_checkpoint_pruned_while_copied_is_not_resumed_from(tmp_path: Path) -> None:
    """A stale attempt that wakes up keeps checkpointing and pruning its own run."""

    class Pruning(LocalStore):
        pruned = False

        def download_dir(self, prefix: str, local_dir: Path) -> list[Path]:
            paths = super().download_dir(prefix, local_dir)
            if not self.pruned:  # the stale run commits step 9 and drops step 6
                self.pruned = True
                commit(self, "job-1", 1, 9)
                self.delete_prefix(f"{run_key('job-1', 1)}/{checkpoint_dir_name(6)}/")
            return paths

    store = Pruning(tmp_path)
    commit(store, "job-1", 1, 3, 6)
    point = prepare_resume(store, "job-1", 2)
    assert point is not None
    assert point.step == 9
    assert store.get_bytes(f"{point.key}/{ADAPTER_FILE}") == checkpoint_dir_name(9).encode()


def test_a_rerun_does_not_resume_from_the_attempts_it_distrusts(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    commit(store, "job-1", 1, 3, 6)
    assert prepare_resume(store, "job-1", 2, after=1) is None
    commit(store, "job-1", 2, 2)
    point = prepare_resume(store, "job-1", 3, after=1)
    assert point is not None
    assert point.step == 2


def test_a_replay_starts_from_the_target_s_committed_checkpoint_in_place(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    commit(store, "job-1", 1, 4, 6)
    target = VerifyTarget(job_id="job-1", attempt=1, worker_id="w1", from_step=4, to_step=6)
    point = replay_start(store, target)
    assert point.step == 4
    assert point.key == f"{run_key('job-1', 1)}/{checkpoint_dir_name(4)}"
    # An end that is not a committed checkpoint (pruned, or never committed): no replay.
    with pytest.raises(CheckpointError, match="no committed checkpoint at step 8"):
        replay_start(store, target.model_copy(update={"to_step": 8}))

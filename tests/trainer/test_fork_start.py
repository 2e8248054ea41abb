"""Where a fork (``from_checkpoint``) starts, without Ray: from the checkpoint's adapter (its
files checked against the sha256 the registry pinned), and with ``from_checkpoint_optimizer``
from the whole checkpoint, unless an earlier attempt of its own has committed one since."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm_contracts.jobs import ForkPoint
from swarm_contracts.layout import SNAPSHOT_FILE, checkpoint_dir_name, fork_key, run_key
from swarm_runtime.store import LocalStore, sha256_file
from swarm_trainer.checkpoint import ADAPTER_FILE
from swarm_trainer.parent_adapter import (
    PARENT_FILES,
    ParentAdapterError,
    missing_fork_files,
    starting_adapter,
)
from swarm_trainer.run import PreflightError, preflight, starting_point

from .conftest import make_assignment

JOB = "job-0123456789abcdef0123"
SOURCE = "job-aaaaaaaaaaaaaaaaaaaa"


def pinned(store: LocalStore, tmp_path: Path, optimizer: bool) -> ForkPoint:
    """A fork point as the registry pins it: the copy among the job's own checkpoints."""
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (copy / ADAPTER_FILE).write_bytes(b"weights at 4")
    files = store.upload_dir(copy, fork_key(JOB))
    return ForkPoint(
        job_id=SOURCE,
        attempt=1,
        step=4,
        store_key=fork_key(JOB),
        files={name: files[name] for name in PARENT_FILES},
        optimizer=optimizer,
    )


def test_a_fork_with_the_optimizer_starts_from_the_whole_checkpoint_until_it_has_its_own(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(store, tiny_model_dir, job_id=JOB)
    fork = pinned(store, tmp_path, optimizer=True)
    first = job.model_copy(update={"fork": fork})
    point = starting_point(first, store)
    assert point is not None
    assert (point.step, point.key) == (4, fork_key(JOB))

    # Attempt 1 committed step 6 of its own run: attempt 2 goes on from there.
    name = checkpoint_dir_name(6)
    store.put_bytes(f"{run_key(JOB, 1)}/{name}/{ADAPTER_FILE}", b"weights at 6")
    snapshot = {"latest_checkpoint_result": {"checkpoint_dir_name": name}}
    store.put_bytes(f"{run_key(JOB, 1)}/{SNAPSHOT_FILE}", json.dumps(snapshot).encode())
    second = first.model_copy(update={"attempt": 2})
    again = starting_point(second, store)
    assert again is not None
    assert again.step == 6

    # Without the optimizer the fork trains from step 0: only its weights come from there.
    weights_only = job.model_copy(update={"fork": fork.model_copy(update={"optimizer": False})})
    assert starting_point(weights_only, store) is None


def test_a_fork_starts_from_the_checkpoint_s_adapter_checked_against_its_pin(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(store, tiny_model_dir, job_id=JOB)
    assert starting_adapter(store, job, tmp_path / "none") is None  # a fresh LoRA
    fork = pinned(store, tmp_path, optimizer=False)
    forked = job.model_copy(update={"fork": fork})
    directory = starting_adapter(store, forked, tmp_path / "start")
    assert directory is not None
    assert (directory / ADAPTER_FILE).read_bytes() == b"weights at 4"
    assert sha256_file(directory / ADAPTER_FILE) == fork.files[ADAPTER_FILE]

    store.put_bytes(f"{fork.store_key}/{ADAPTER_FILE}", b"tampered")
    with pytest.raises(ParentAdapterError, match=f"from_checkpoint {SOURCE}@4: {ADAPTER_FILE}"):
        starting_adapter(store, forked, tmp_path / "again")


def test_a_fork_whose_copy_is_gone_fails_before_any_ray_worker_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(store, tiny_model_dir, job_id=JOB)
    fork = pinned(store, tmp_path, optimizer=False)
    forked = job.model_copy(update={"fork": fork})
    assert missing_fork_files(store, fork) == []
    preflight(forked, store)
    store.delete(f"{fork.store_key}/adapter_config.json")
    with pytest.raises(PreflightError, match=f"from_checkpoint {SOURCE}@4: adapter_config.json"):
        preflight(forked, store)

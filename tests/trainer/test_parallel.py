"""Data-parallel: two Ray Train workers train on disjoint shards and end with one adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm_runtime.store import LocalStore
from swarm_trainer.hooks import RecordRanks
from swarm_trainer.run import run_job
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.stream import Holdout

from .conftest import arithmetic_records, make_assignment

pytestmark = pytest.mark.slow


def test_two_workers_see_disjoint_shards_and_agree_on_weights(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(
        store,
        tiny_model_dir,
        job_id="job-dddddddddddddddddddd",
        training={"max_steps": 4, "batch_size": 4, "checkpoint_every": 4, "eval_every": 4},
        resources={"workers": 2, "cpus_per_worker": 1},
    )
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    result = run_job(job, settings, store, hooks=RecordRanks(str(trace_dir)))
    assert result is not None

    ranks = [json.loads((trace_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    seen = [set(r["sources"]) for r in ranks]
    # 4 steps x 4 examples each, all from the rank's own shard, none shared.
    assert all(len(r["sources"]) == 16 for r in ranks)
    assert seen[0]
    assert seen[1]
    assert not seen[0] & seen[1]
    # A one-frame dataset: each rank takes every other training record of it (its sources
    # are record numbers, frame 0), never a held-out one.
    t = job.spec.training
    train = Holdout(t.val_fraction, None, t.seed).split(len(arithmetic_records()), 0).train
    assert seen[0] <= set(train[0::2])
    assert seen[1] <= set(train[1::2])
    # Gradients were averaged across ranks every step: identical adapters, bit for bit.
    assert ranks[0]["adapter_digest"] == ranks[1]["adapter_digest"]
    # Each rank saved its own RNG streams into the one committed checkpoint.
    ckpts = store.list(f"checkpoints/{job.job_id}/attempt-1/checkpoint_")
    names = {k.rsplit("/", 1)[-1] for k in ckpts}
    assert {"rng_rank0.safetensors", "rng_rank1.safetensors"} <= names

"""An ``resources.strategy: fsdp`` job on two Ray Train CPU workers (gloo): it trains,
checkpoints, and registers the adapter layout a DDP job does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_runtime.store import LocalStore
from swarm_trainer.model import build_model
from swarm_trainer.run import PreflightError, committed_checkpoint_step, preflight, run_job
from swarm_trainer.settings import TrainerSettings

from .conftest import drain, make_assignment
from .test_resume import losses_by_step

pytestmark = pytest.mark.slow

# batch_size 3 leaves the ranks' validation shards (4 and 3 examples) 2 and 1 batches: the
# sharded evaluation must keep them in lockstep. Dropout draws from each rank's RNG streams,
# which a resume restores.
TRAINING = {"max_steps": 4, "batch_size": 3, "checkpoint_every": 2, "eval_every": 2, "seed": 5}
LORA = {"dropout": 0.1}
LORA_SPEC = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": "all-linear"}
FSDP_JOB = "job-f1f1f1f1f1f1f1f1f1f1"


def run(
    tmp_path: Path, tiny_model_dir: Path, job_id: str, strategy: str, **kwargs: Any
) -> tuple[dict[int, float], dict[str, Any], LocalStore]:
    """(losses by step, the registered adapter's weights, the store) of one 2-worker run."""
    from swarm_trainer.control import make_control

    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(
        store,
        tiny_model_dir,
        job_id=job_id,
        training=TRAINING,
        lora=LORA,
        resources={"workers": 2, "cpus_per_worker": 1, "strategy": strategy},
    )
    control = make_control()
    result = run_job(job, settings, store, control=control, **kwargs)
    assert result is not None
    return losses_by_step(drain(control)), registered(store, result.adapter_key, tmp_path), store


def registered(store: LocalStore, adapter_key: str, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "registered.safetensors"
    store.get_file(f"{adapter_key}/adapter_model.safetensors", path)
    return load_file(path)


def test_an_fsdp_job_trains_checkpoints_and_registers_a_peft_adapter(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The recipe end to end under fsdp (equal losses to DDP and an exact resume are
    ``test_sharding``'s, without Ray)."""
    losses, adapter, store = run(tmp_path, tiny_model_dir, FSDP_JOB, "fsdp")
    assert sorted(losses) == [1, 2, 3, 4]
    assert losses[4] < losses[1]
    # Gathered whole from the shards, in the layout a single-process run saves.
    expected = get_peft_model_state_dict(
        build_model(tiny_model_dir, LoraSpec(**LORA_SPEC), TrainingSpec())
    )
    assert adapter.keys() == expected.keys()
    assert all(adapter[k].shape == expected[k].shape for k in expected)
    assert committed_checkpoint_step(store, FSDP_JOB, 1) == 4
    names = {
        k.rsplit("/", 1)[-1]
        for k in store.list(f"checkpoints/{FSDP_JOB}/attempt-1/checkpoint_00000004/")
    }
    assert {"adapter_model.safetensors", "optimizer.safetensors", "rng_rank1.safetensors"} <= names


def test_fsdp_refuses_a_quantized_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(
        store,
        tiny_model_dir,
        lora={"quantize": "nf4"},
        resources={"workers": 2, "gpus_per_worker": 1, "strategy": "fsdp"},
    )
    with pytest.raises(PreflightError, match="strategy fsdp"):
        preflight(job, store)

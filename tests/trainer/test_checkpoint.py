"""Checkpoints hold adapter, optimizer and schedule in safetensors + JSON, and load back exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from swarm_contracts.layout import resume_key, run_key
from swarm_contracts.verification import VerifyTarget
from swarm_runtime.store import LocalStore
from swarm_trainer.checkpoint import (
    ADAPTER_FILE,
    SNAPSHOT_FILE,
    CheckpointError,
    checkpoint_dir_name,
    committed_checkpoint_step,
    load_checkpoint,
    prepare_resume,
    replay_start,
    save_checkpoint,
    wait_committed,
)
from swarm_trainer.reports import Evaluation
from swarm_trainer.step import lr_lambda
from swarm_trainer.train_state import TrainState


def setup(model_dir: Path, seed: int) -> tuple:
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(2, 10))
    return model, optimizer, scheduler


def step(model, optimizer, scheduler) -> float:  # type: ignore[no-untyped-def]
    ids = torch.arange(1, 9).unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(loss.detach())


def test_checkpoint_round_trip_continues_identically(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir, seed=0)
    for _ in range(3):
        step(model, optimizer, scheduler)
    evaluation = Evaluation(step=2, eval_loss=1.5, perplexity=4.48)
    best = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    state = TrainState(
        step=3,
        data_index=6,
        train_loss=1.25,
        eval_history=[evaluation],
        best=evaluation,
        best_weights=best,
    )
    save_checkpoint(tmp_path, model, optimizer.state_dict(), scheduler, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "best_adapter.safetensors",
        "optimizer.safetensors",
        "optimizer_groups.json",
        "scheduler.json",
        "trainer_state.json",
    ]
    expected = [step(model, optimizer, scheduler) for _ in range(2)]

    # A fresh model with different LoRA init, restored from the checkpoint.
    model2, optimizer2, scheduler2 = setup(tiny_model_dir, seed=1)
    loaded = load_checkpoint(tmp_path, model2, optimizer2, scheduler2)
    assert loaded == state
    assert loaded.best_weights is not None
    assert loaded.best_weights.keys() == best.keys()
    assert all(torch.equal(loaded.best_weights[k], best[k]) for k in best)
    resumed = [step(model2, optimizer2, scheduler2) for _ in range(2)]
    assert resumed == expected


def test_train_state_reads_what_the_dict_based_loop_wrote() -> None:
    """Checkpoints written before ``TrainState`` existed hold this JSON: they still resume."""
    written = {
        "step": 10,
        "data_index": 20,
        "eval_history": [
            {"step": 5, "eval_loss": 2.5, "perplexity": 12.18},
            {"step": 10, "eval_loss": 2.75, "perplexity": 15.64},
        ],
        "train_loss": 2.0,
        "best": {"step": 5, "eval_loss": 2.5, "perplexity": 12.18},
    }
    state = TrainState.from_json(json.loads(json.dumps(written)))
    assert state.step == 10
    assert state.data_index == 20
    assert state.best == Evaluation(step=5, eval_loss=2.5, perplexity=12.18)
    assert [e.step for e in state.eval_history] == [5, 10]
    assert state.to_json() == written  # and it writes the same layout back
    assert TrainState.from_json({**written, "best": None, "eval_history": []}).best is None


# --- which checkpoint a new attempt starts from ----------------------------------------------


def commit(store: LocalStore, job_id: str, attempt: int, *steps: int) -> None:
    """Checkpoint directories of ``attempt``'s run and Ray's snapshot listing them."""
    names = [checkpoint_dir_name(s) for s in steps]
    for name in names:
        store.put_bytes(f"{run_key(job_id, attempt)}/{name}/{ADAPTER_FILE}", name.encode())
    snapshot = {
        "checkpoint_results": [{"checkpoint_dir_name": n} for n in names],
        "latest_checkpoint_result": {"checkpoint_dir_name": names[-1]},
    }
    store.put_bytes(f"{run_key(job_id, attempt)}/{SNAPSHOT_FILE}", json.dumps(snapshot).encode())


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

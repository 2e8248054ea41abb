"""A real Ray Train run of the tiny model on CPU: checkpoints, adapter, learning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm_common.settings import Settings
from swarm_common.store import LocalStore
from swarm_trainer.checkpoint import ADAPTER_FILE
from swarm_trainer.run import PreflightError, run_job
from swarm_trainer.tiny_model import create_tiny_model

from .conftest import make_assignment

pytestmark = pytest.mark.slow


def test_tiny_model_loads_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert not list(tiny_model_dir.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "llama" and len(tok) == model.config.vocab_size
    ids = tok("Question: hi", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == len(tok)
    # Same seed, same weights: the demo model is reproducible.
    again = create_tiny_model(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (
        tiny_model_dir / "model.safetensors"
    ).read_bytes()


def test_missing_model_files_fail_fast(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(store, tiny_model_dir)
    job = job.model_copy(
        update={"base_model": job.base_model.model_copy(update={"store_key": "models/nope/1"})}
    )
    settings = Settings(store_url=store.url, work_dir=tmp_path / "work")
    with pytest.raises(PreflightError, match=r"no config\.json"):
        run_job(job, settings, store)


def test_ray_train_run_checkpoints_and_learns(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from ray.util.queue import Queue
    from transformers import AutoModelForCausalLM

    store = LocalStore(tmp_path / "store")
    settings = Settings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(store, tiny_model_dir)
    queue = Queue()
    result = run_job(job, settings, store, progress=queue)
    assert result is not None

    messages: list[dict[str, Any]] = []
    while not queue.empty():
        messages.append(queue.get())
    kinds = [m["kind"] for m in messages]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    progress = [m for m in messages if m["kind"] == "progress"]
    assert [m["step"] for m in progress] == list(range(1, 11))
    assert [m["step"] for m in messages if m["kind"] == "checkpoint"] == [5, 10]
    assert [m["step"] for m in messages if m["kind"] == "validated"] == [5, 10]
    assert all(m["tokens_per_s"] > 0 for m in progress)

    # Checkpoints are in the store, under Ray Train's run directory for the job's attempt.
    ckpts = store.list(f"checkpoints/{job.job_id}/attempt-1/checkpoint_")
    assert any(k.endswith(f"checkpoint_00000010/{ADAPTER_FILE}") for k in ckpts)
    assert any("checkpoint_00000005/" in k for k in ckpts)

    # The final adapter: PEFT layout, safetensors only, and it changes the model.
    adapter_keys = store.list(result.adapter_key + "/")
    names = {k.rsplit("/", 1)[-1] for k in adapter_keys}
    assert names == {"adapter_config.json", ADAPTER_FILE}
    adapter_dir = tmp_path / "adapter"
    store.download_dir(result.adapter_key, adapter_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    ids = torch.tensor([[1, 300, 301, 302, 303]])
    with torch.no_grad():
        before = base(ids).logits.clone()
        tuned = PeftModel.from_pretrained(base, adapter_dir)
        after = tuned(ids).logits
    assert not torch.allclose(before, after)

    # It learned: training loss fell, and eval loss at the end beats the first eval.
    losses = [m["loss"] for m in progress]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses
    evals = [m["eval_loss"] for m in messages if m["kind"] == "validated"]
    assert evals[-1] < evals[0]
    # The registered adapter is the best by eval loss; its step is recorded.
    best = min((m for m in messages if m["kind"] == "validated"), key=lambda m: m["eval_loss"])
    assert result.metrics["eval_loss"] == best["eval_loss"]
    assert result.metrics["best_step"] == best["step"]
    assert result.metrics["last_eval_loss"] == evals[-1]
    assert json.dumps(result.metrics)  # plain JSON for the succeeded event

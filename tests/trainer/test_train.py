"""A real Ray Train run of the tiny model on CPU: checkpoints, adapter, learning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_runtime.store import LocalStore
from swarm_trainer import reports
from swarm_trainer.checkpoint import ADAPTER_FILE
from swarm_trainer.run import PreflightError, run_job
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.tiny_model import create_tiny_model

from .conftest import drain, make_assignment

pytestmark = pytest.mark.slow


def test_tiny_model_loads_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert not list(tiny_model_dir.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "llama"
    assert len(tok) == model.config.vocab_size
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
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    with pytest.raises(PreflightError, match=r"no config\.json"):
        run_job(job, settings, store)


def test_ray_train_run_checkpoints_and_learns(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from swarm_trainer.control import make_control

    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(store, tiny_model_dir)
    control = make_control()
    result = run_job(job, settings, store, control=control)
    assert result is not None

    messages = drain(control)
    assert isinstance(messages[0], reports.Started)
    assert isinstance(messages[-1], reports.Finished)
    progress = [m for m in messages if isinstance(m, reports.Progress)]
    checkpoints = [m for m in messages if isinstance(m, reports.CheckpointReported)]
    validated = [m for m in messages if isinstance(m, reports.Validated)]
    assert [m.step for m in progress] == list(range(1, 11))
    assert [m.step for m in checkpoints] == [5, 10]
    assert [m.step for m in validated] == [5, 10]
    assert all(m.tokens_per_s > 0 for m in progress)

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
    losses = [m.loss for m in progress]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses
    evals = [m.eval_loss for m in validated]
    assert evals[-1] < evals[0]
    # The registered adapter is the best by eval loss; its step is recorded.
    best = min(validated, key=lambda m: m.eval_loss)
    assert result.metrics.eval_loss == best.eval_loss
    assert result.metrics.best_step == best.step
    assert result.metrics.last_eval_loss == evals[-1]
    assert [e.eval_loss for e in result.metrics.eval_history] == evals
    assert result.metrics.event_metrics()["eval_loss"] == best.eval_loss


def test_a_second_job_on_the_same_model_takes_it_from_the_cache(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from swarm_trainer.control import make_control

    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    short = {"max_steps": 2, "eval_every": 2, "checkpoint_every": 2}
    first = make_assignment(store, tiny_model_dir, job_id="job-first", training=short)
    control = make_control()
    assert run_job(first, settings, store, control=control) is not None
    started = next(m for m in drain(control) if isinstance(m, reports.Started))
    assert started.cached == ()

    # Every model and dataset byte in the store now says something else: a job that read any
    # of them would fail their digests. The second job must not need them.
    for key in [*store.list(first.base_model.store_key + "/"), first.dataset.store_key]:
        store.put_bytes(key, b"tampered")
    second = first.model_copy(update={"job_id": "job-second"})
    assert run_job(second, settings, store, control=control) is not None
    started = next(m for m in drain(control) if isinstance(m, reports.Started))
    assert started.cached == ("base_model", "dataset")

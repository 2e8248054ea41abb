"""QLoRA on a machine without CUDA or bitsandbytes: a clear refusal, before and inside the
Ray worker; and the adapter the QLoRA code path trains is a plain PEFT adapter that stock
peft loads on the unquantized base (the 4-bit load itself needs a GPU: there it is stood in
for by an ordinary bf16 load, everything after it runs as on a GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_runtime.store import LocalStore
from swarm_trainer import quantization
from swarm_trainer.checkpoint import save_adapter
from swarm_trainer.data import collate
from swarm_trainer.methods.sft import tokenize
from swarm_trainer.model import build_model
from swarm_trainer.quantization import QuantizationUnavailable, nf4_config, nf4_unavailable
from swarm_trainer.run import PreflightError, preflight
from swarm_trainer.step import train_step

from .conftest import make_assignment

NF4 = LoraSpec(r=4, alpha=8, dropout=0.0, target_modules="all-linear", quantize="nf4")


def test_nf4_is_refused_without_cuda(tiny_model_dir: Path) -> None:
    with pytest.raises(QuantizationUnavailable, match="needs a CUDA GPU"):
        build_model(tiny_model_dir, NF4, TrainingSpec(), device=torch.device("cpu"))
    with pytest.raises(QuantizationUnavailable, match="needs a CUDA GPU"):
        build_model(tiny_model_dir, NF4, TrainingSpec())


def test_nf4_is_refused_without_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quantization.importlib.util, "find_spec", lambda name: None)
    reason = nf4_unavailable(torch.device("cuda", 0))
    assert reason is not None
    assert "swarm-trainer[qlora]" in reason


def test_preflight_refuses_nf4_without_gpus_or_bitsandbytes(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store")
    cpu_job = make_assignment(store, tiny_model_dir, lora={"quantize": "nf4"})
    with pytest.raises(PreflightError, match="needs GPUs"):
        preflight(cpu_job, store)
    gpu_job = make_assignment(
        store, tiny_model_dir, lora={"quantize": "nf4"}, resources={"gpus_per_worker": 1}
    )
    import swarm_trainer.run as run

    monkeypatch.setattr(run.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PreflightError, match="bitsandbytes"):
        preflight(gpu_job, store)


def test_nf4_config_is_qlora() -> None:
    config = nf4_config()
    assert config.load_in_4bit
    assert config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert config.bnb_4bit_use_double_quant


def train_and_save(model: PeftModel, tokenizer: Any, out: Path) -> Path:
    batch = collate(tokenize([{"text": "The quick brown fox jumps."}], tokenizer, 32), 0)
    lora = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(lora, lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    for _ in range(2):
        train_step(model, [batch], opt, sched, 1.0, torch.device("cpu"))
    save_adapter(model, out)
    return out


def test_the_qlora_path_registers_a_plain_adapter(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: dict[str, Any] = {}
    plain_load = AutoModelForCausalLM.from_pretrained

    def stand_in(model_dir: Path, **kwargs: Any) -> Any:
        # What bitsandbytes would be asked for; the load itself is an ordinary bf16 one.
        loaded.update(kwargs)
        kwargs.pop("quantization_config"), kwargs.pop("device_map")
        return plain_load(model_dir, **kwargs)

    monkeypatch.setattr(quantization, "nf4_unavailable", lambda device: None)
    monkeypatch.setattr(quantization.AutoModelForCausalLM, "from_pretrained", stand_in)
    torch.manual_seed(0)
    qlora = build_model(tiny_model_dir, NF4, TrainingSpec(), device=torch.device("cuda", 0))
    assert loaded["quantization_config"].bnb_4bit_quant_type == "nf4"
    assert loaded["device_map"] == {"": 0}
    assert loaded["dtype"] == torch.bfloat16
    # prepare_model_for_kbit_training: only the adapter trains, the rest is fp32.
    assert all(p.dtype == torch.float32 for p in qlora.parameters())
    trainable = {n for n, p in qlora.named_parameters() if p.requires_grad}
    assert trainable
    assert all(".lora_" in n for n in trainable)
    monkeypatch.undo()

    plain_spec = NF4.model_copy(update={"quantize": None})
    torch.manual_seed(0)
    plain = build_model(tiny_model_dir, plain_spec, TrainingSpec())
    q_dir = train_and_save(qlora.train(), tokenizer, tmp_path / "qlora")
    p_dir = train_and_save(plain.train(), tokenizer, tmp_path / "plain")

    # The same files, config and tensor names, shapes and dtypes as an unquantized job's.
    assert sorted(f.name for f in q_dir.iterdir()) == sorted(f.name for f in p_dir.iterdir())
    q_config = json.loads((q_dir / "adapter_config.json").read_text())
    p_config = json.loads((p_dir / "adapter_config.json").read_text())
    assert q_config == p_config
    assert not [k for k in q_config if any(w in k.lower() for w in ("quant", "bnb", "4bit"))]
    with (
        safe_open(q_dir / "adapter_model.safetensors", "pt") as q,
        safe_open(p_dir / "adapter_model.safetensors", "pt") as p,
    ):
        names = sorted(q.keys())
        assert names == sorted(p.keys())
        for key in names:
            assert q.get_tensor(key).shape == p.get_tensor(key).shape
            assert q.get_tensor(key).dtype == p.get_tensor(key).dtype == torch.float32

    # Stock peft on the unquantized base: every adapter weight lands where it was trained.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    served = PeftModel.from_pretrained(base, q_dir)
    trained = {n: p for n, p in qlora.named_parameters() if ".lora_" in n}
    for name, param in served.named_parameters():
        if ".lora_" in name:
            assert torch.equal(param, trained[name].detach()), name

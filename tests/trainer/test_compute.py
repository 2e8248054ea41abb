"""How a rank computes: chosen per device; bf16 LoRA without an input round trip; Liger's
fused kernels give the plain path's loss; GPU-only choices fail before any Ray worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from peft.tuners.lora import LoraLayer

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_runtime.store import LocalStore
from swarm_trainer import compute as compute_module
from swarm_trainer.compute import Compute, KernelsUnavailable, choose_compute, liger_installed
from swarm_trainer.data import collate_packed
from swarm_trainer.methods.sft import tokenize
from swarm_trainer.model import build_model
from swarm_trainer.run import PreflightError, preflight

from .conftest import make_assignment

CPU = torch.device("cpu")
RECORDS = [
    {"prompt": "Question: what is 3 plus 3? Answer:", "completion": " 6."},
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"prompt": "Translate to French: cat ->", "completion": " chat, dog -> chien."},
]


def test_cpu_computes_in_fp32_with_per_example_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = choose_compute(TrainingSpec(), CPU)
    assert chosen == Compute(CPU, bf16=False, attention="sdpa_varlen", liger=False)
    # Without a mask to grow, a micro-batch is one row; the dense fallback keeps seq_len rows.
    assert chosen.packed_row(256, 8) == 256 * 8
    assert dataclasses.replace(chosen, attention="sdpa").packed_row(256, 8) == 256
    # Liger's kernels are Triton (GPU) kernels: never on CPU, even where installed.
    monkeypatch.setattr(compute_module, "liger_installed", lambda: True)
    assert not choose_compute(TrainingSpec(), CPU).liger
    with pytest.raises(KernelsUnavailable, match=r"training\.liger"):
        choose_compute(TrainingSpec(liger="on"), CPU)


def test_bf16_lora_keeps_fp32_masters_and_takes_its_input_as_it_comes(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    bf16 = Compute(CPU, bf16=True, attention="sdpa_varlen", liger=False)
    model = build_model(tiny_model_dir, LoraSpec(dropout=0.0), TrainingSpec(), compute=bf16)
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert {p.dtype for p in base} == {torch.bfloat16}
    assert lora
    assert {p.dtype for p in lora} == {torch.float32}
    assert all(p.requires_grad for p in lora)

    seen: list[torch.dtype] = []
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        layer.lora_A["default"].register_forward_pre_hook(lambda _, a: seen.append(a[0].dtype))
    batch = collate_packed(tokenize(RECORDS, tokenizer, 64), tokenizer.pad_token_id, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch.model_inputs(), use_cache=False).loss
    loss.backward()
    # peft's default would have cast each LoRA input to fp32 (for autocast to cast it back).
    assert seen
    assert set(seen) == {torch.bfloat16}
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in lora)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and liger_installed()),
    reason="Liger Kernel needs CUDA and the liger_kernel package (optional, not installed here)",
)
def test_liger_kernels_give_the_plain_loss(tiny_model_dir: Path, tokenizer: Any) -> None:
    cuda = torch.device("cuda")
    batch = collate_packed(tokenize(RECORDS * 2, tokenizer, 64), tokenizer.pad_token_id, 64)

    def loss(liger: bool) -> float:
        torch.manual_seed(0)
        chosen = Compute(cuda, bf16=True, attention="sdpa", liger=liger)
        model = build_model(tiny_model_dir, LoraSpec(dropout=0.0), TrainingSpec(), compute=chosen)
        model = model.to(cuda).train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch.to(cuda).model_inputs(), use_cache=False, num_items_in_batch=5)
        out.loss.backward()
        return float(out.loss)

    assert abs(loss(True) - loss(False)) < 2e-2


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ({"attention": "flex_attention"}, r"training\.attention flex_attention needs GPUs"),
        ({"attention": "flash_attention_2"}, r"training\.attention flash_attention_2"),
        ({"liger": "on"}, r"training\.liger on needs GPUs"),
    ],
)
def test_gpu_only_choices_fail_preflight_on_cpu_jobs(
    training: dict[str, Any], match: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    job = make_assignment(store, tiny_model_dir, training=training)
    with pytest.raises(PreflightError, match=match):
        preflight(job, store)

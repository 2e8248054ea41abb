"""The memory estimate's activation terms against what autograd really keeps for the trainer's
model (``build_model``), on CPU: the tensors saved for the backward pass of one micro-batch,
counted once per storage, parameters excluded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarm_contracts.jobs import JobSpec
from swarm_contracts.memory import ModelShape
from swarm_contracts.memory_estimate import estimate_memory
from swarm_trainer.compute import Compute
from swarm_trainer.data import Example
from swarm_trainer.methods import for_job
from swarm_trainer.methods.dpo import Pair, collate_pairs
from swarm_trainer.model import build_model

BATCH, SEQ_LEN = 2, 128
# What a GPU rank runs (bf16 base, sdpa), here on CPU where autograd's saved tensors can be
# counted; the trainer itself computes in fp32 on CPU.
GPU_LIKE = Compute(torch.device("cpu"), bf16=True, attention="sdpa", liger=False)


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Llama whose widths differ (hidden ≠ MLP ≠ K/V), saved in bf16."""
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=352,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        vocab_size=640,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("bf16-llama")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def saved_bytes(
    model: torch.nn.Module, ids: torch.Tensor, loss_of: Callable[[], torch.Tensor] | None = None
) -> int:
    """Bytes autograd keeps between the forward and the backward pass (not the weights), for
    the model's own loss on ``ids`` or ``loss_of()``."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    # bf16 autocast, as the trainer's step runs a bf16 base (fp32 LoRA weights) on a GPU.
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        loss = loss_of() if loss_of is not None else model(input_ids=ids, labels=ids).loss
    loss.backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


def shape_and_spec(
    model_dir: Path, method: dict[str, object] | None = None, **training: object
) -> tuple[ModelShape, JobSpec]:
    config = json.loads((model_dir / "config.json").read_text())
    shape = ModelShape.from_config(config, parameter_count=0)
    assert shape is not None
    assert shape.dtype == "bfloat16"
    spec = JobSpec.model_validate(
        {
            "name": "m",
            "base_model": "m",
            "dataset": "ds-" + "0" * 16,
            "lora": {"r": 8, "target_modules": "all-linear", "dropout": 0.0},
            "training": {"batch_size": BATCH, "seq_len": SEQ_LEN, "precision": "bf16", **training},
            "method": method or {"type": "sft"},
        }
    )
    return shape, spec


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_activation_estimate_covers_what_autograd_keeps(
    bf16_model_dir: Path, targets: str | list[str]
) -> None:
    shape, spec = shape_and_spec(bf16_model_dir)
    spec.lora.target_modules = targets
    torch.manual_seed(0)
    model = build_model(bf16_model_dir, spec.lora, spec.training, compute=GPU_LIKE).train()
    ids = torch.randint(0, shape.vocab_size, (BATCH, SEQ_LEN))
    measured = saved_bytes(model, ids)
    estimate = estimate_memory(shape, spec)
    # Of the logits term, the fp32 log-probabilities are what the forward pass keeps.
    kept_for_loss = estimate.tokens * shape.vocab_size * 4
    predicted = estimate.activations_bytes + kept_for_loss
    # Never below what is really kept (a floor that is too low lets a job run out of memory),
    # and not far above it (a floor too high keeps jobs off GPUs that would fit them). The
    # margin leaves room for a trainer that keeps less (bf16 LoRA inputs) before it is re-fit.
    # (1 KiB: scalars such as the loss.)
    assert measured <= predicted + 1024 <= 1.5 * measured, (measured, predicted)


def test_checkpointing_estimate_covers_what_autograd_keeps(bf16_model_dir: Path) -> None:
    shape, spec = shape_and_spec(bf16_model_dir, gradient_checkpointing=True)
    torch.manual_seed(0)
    model = build_model(bf16_model_dir, spec.lora, spec.training, compute=GPU_LIKE).train()
    ids = torch.randint(0, shape.vocab_size, (BATCH, SEQ_LEN))
    measured = saved_bytes(model, ids)
    estimate = estimate_memory(shape, spec)
    plain = estimate_memory(shape, shape_and_spec(bf16_model_dir)[1])
    predicted = estimate.activations_bytes + estimate.tokens * shape.vocab_size * 4
    # The forward pass keeps each layer's input; the estimate adds the one layer recomputed in
    # the backward pass, which the hooks do not see as kept.
    assert measured <= predicted + 1024
    assert estimate.activations_bytes < plain.activations_bytes / 2


def test_dpo_estimate_covers_what_autograd_keeps_for_both_sequences(bf16_model_dir: Path) -> None:
    """A DPO micro-batch of BATCH pairs, every sequence SEQ_LEN long (half prompt, half
    answer): the policy's forward over 2 x BATCH sequences is kept, the reference's not."""
    shape, spec = shape_and_spec(bf16_model_dir, method={"type": "dpo"})
    torch.manual_seed(0)
    model = build_model(bf16_model_dir, spec.lora, spec.training, compute=GPU_LIKE).train()
    method = for_job(spec.method, model, from_parent=False)

    def sequence() -> Example:
        ids = torch.randint(0, shape.vocab_size, (SEQ_LEN,)).tolist()
        return Example(ids, [-100] * (SEQ_LEN // 2) + ids[SEQ_LEN // 2 :])

    batch = collate_pairs([Pair(sequence(), sequence(), k) for k in range(BATCH)], 0, None)
    assert batch.inputs["input_ids"].shape == (2 * BATCH, SEQ_LEN)
    measured = saved_bytes(
        model, batch.inputs["input_ids"], lambda: method.loss(model, batch, BATCH, True)[0]
    )
    estimate = estimate_memory(shape, spec)
    assert estimate.tokens == 2 * BATCH * SEQ_LEN
    predicted = estimate.activations_bytes + estimate.tokens * shape.vocab_size * 4
    assert measured <= predicted + 1024 <= 1.5 * measured, (measured, predicted)

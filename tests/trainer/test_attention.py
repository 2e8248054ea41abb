"""Packed rows on every attention path that runs here: no example sees another, every path
gives the same loss (and, where it can train, the same gradients), and the CPU default never
builds a dense mask."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer import attention
from swarm_trainer.attention import AttentionUnavailable, choose_attention, segments
from swarm_trainer.compute import Compute
from swarm_trainer.data import Batch, BatchSampler, Example, StepBatches, collate_packed
from swarm_trainer.methods.sft import causal_lm_loss, tokenize
from swarm_trainer.model import build_model

RECORDS = [
    {"prompt": "Question: what is 3 plus 3? Answer:", "completion": " 6."},
    {"prompt": "Translate to French: cat ->", "completion": " chat, dog -> chien."},
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"prompt": "Question: what is two plus two? Answer:", "completion": " Four."},
    {"text": "Workers send heartbeats; the scheduler places jobs."},
]
CPU = torch.device("cpu")
CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' flex path (the BlockMask it builds from the positions) with PyTorch's
    uncompiled flex kernel: compiling it on CPU takes about a minute, and PyTorch 2.13 has no
    CPU backward for it anyway, so on CPU it is checked forward only."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def uncompiled(q: Any, k: Any, v: Any, training: bool = False, **kwargs: Any) -> Any:
        return flex_attention(q, k, v, **kwargs)

    def block_mask(**kwargs: Any) -> Any:
        return create_block_mask(**{**kwargs, "_compile": False})

    monkeypatch.setattr(
        "transformers.integrations.flex_attention.compile_friendly_flex_attention", uncompiled
    )
    monkeypatch.setattr("transformers.masking_utils.create_block_mask", block_mask)


def model_with(model_dir: Path, impl: str, device: torch.device = CPU, bf16: bool = False) -> Any:
    torch.manual_seed(0)
    compute = Compute(device, bf16, impl, liger=False)
    model = build_model(model_dir, LoraSpec(dropout=0.0), TrainingSpec(), compute=compute)
    # A non-zero LoRA B, so that the adapter is part of what is compared.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model.to(device)


def packed(examples: list[Example], pad: int) -> Batch:
    # Rows of 48 tokens: several rows, several examples per row.
    batch = collate_packed(examples, pad, capacity=48)
    assert batch.inputs["input_ids"].shape[0] > 1
    assert len(batch.sources) > batch.inputs["input_ids"].shape[0]
    return batch


def spans(batch: Batch) -> dict[int, tuple[int, int, int]]:
    """Each example's (row, start, end) in a packed batch."""
    width = batch.inputs["input_ids"].shape[1]
    bounds = batch.inputs["cu_seq_lens_q"].tolist()
    flat = list(itertools.pairwise(bounds))
    # Segments that are a row's tail padding carry no example.
    labels = batch.inputs["labels"].flatten()
    real = [(a, b) for a, b in flat if int(labels[a:b].ne(-100).sum())]
    return {
        s: (a // width, a % width, a % width + b - a)
        for s, (a, b) in zip(batch.sources, real, strict=True)
    }


def altered(examples: list[Example], index: int) -> list[Example]:
    """The same examples with every token of one of them changed (same length)."""
    e = examples[index]
    ids = [(t + 7) % 500 + 5 for t in e.input_ids]
    return [*examples[:index], dataclasses.replace(e, input_ids=ids), *examples[index + 1 :]]


def first_with_neighbours(where: dict[int, tuple[int, int, int]]) -> int:
    """An example at the start of a row that holds more examples after it."""
    rows = [row for row, _, _ in where.values()]
    return next(s for s, (row, a, _) in where.items() if a == 0 and rows.count(row) > 1)


def forward(model: Any, batch: Batch, device: torch.device = CPU, bf16: bool = False) -> Any:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        return model(**batch.to(device).model_inputs(), use_cache=False)


def assert_isolated(model: Any, examples: list[Example], pad: int, **kw: Any) -> None:
    """Changing one example of a row changes its own logits only (the row's first, so that
    causal attention alone would let the others see it)."""
    before = packed(examples, pad)
    where = spans(before)
    changed = first_with_neighbours(where)
    with torch.no_grad():
        ref = forward(model, before, **kw).logits.float().cpu()
        out = forward(model, packed(altered(examples, changed), pad), **kw).logits.float().cpu()
    assert spans(packed(altered(examples, changed), pad)) == where  # the same layout
    row, a, b = where[changed]
    assert not torch.allclose(out[row, a:b], ref[row, a:b], atol=1e-3)  # it can fail
    others = [s for s in where if s != changed]
    assert any(where[s][0] == row for s in others)  # a neighbour in the same row
    for s in others:
        row, a, b = where[s]
        assert torch.allclose(out[row, a:b], ref[row, a:b], atol=1e-5), s


@pytest.mark.parametrize("impl", ["sdpa_varlen", "sdpa", "flex_attention"])
def test_no_example_of_a_packed_row_sees_another(
    impl: str, tiny_model_dir: Path, tokenizer: Any, request: pytest.FixtureRequest
) -> None:
    if impl == "flex_attention":
        request.getfixturevalue("eager_flex")
    examples = tokenize(RECORDS, tokenizer, 64)
    assert_isolated(model_with(tiny_model_dir, impl).eval(), examples, tokenizer.pad_token_id)


def test_every_path_gives_the_loss_and_gradients_of_the_dense_mask(
    tiny_model_dir: Path, tokenizer: Any, eager_flex: None
) -> None:
    batch = packed(tokenize(RECORDS, tokenizer, 64), tokenizer.pad_token_id)
    targets = batch.targets

    def loss_and_grads(impl: str) -> tuple[float, dict[str, torch.Tensor]]:
        model = model_with(tiny_model_dir, impl).train()
        loss = forward(model, batch).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return float(loss.detach()), grads

    dense_loss, dense_grads = loss_and_grads("sdpa")
    varlen_loss, varlen_grads = loss_and_grads("sdpa_varlen")
    assert abs(varlen_loss - dense_loss) < 1e-5
    assert dense_grads.keys() == varlen_grads.keys()
    assert dense_grads
    for name, grad in dense_grads.items():
        assert torch.allclose(varlen_grads[name], grad, atol=1e-6, rtol=1e-4), name
    with torch.no_grad():
        flex_loss = float(forward(model_with(tiny_model_dir, "flex_attention").eval(), batch).loss)
    assert abs(flex_loss - dense_loss) < 1e-5
    assert targets > 0


def test_logits_only_where_a_target_follows_give_the_full_loss_and_gradients(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    examples = tokenize(RECORDS, tokenizer, 64)
    one_row = collate_packed(examples, tokenizer.pad_token_id, capacity=64 * len(examples))
    assert one_row.inputs["input_ids"].shape[0] == 1
    assert one_row.predicting is not None
    assert len(one_row.predicting) == one_row.targets < one_row.tokens  # prompts: no logits

    def loss_and_grads(select: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model = model_with(tiny_model_dir, "sdpa_varlen").train()
        loss = causal_lm_loss(model, one_row, one_row.targets, select_logits=select)
        loss.backward()
        return float(loss.detach()), {
            n: p.grad for n, p in model.named_parameters() if p.grad is not None
        }

    full_loss, full = loss_and_grads(False)
    selected_loss, selected = loss_and_grads(True)
    assert abs(selected_loss - full_loss) < 1e-5
    assert full.keys() == selected.keys()
    assert full
    for name, grad in full.items():
        assert torch.allclose(selected[name], grad, atol=1e-6, rtol=1e-4), name


def test_sdpa_varlen_builds_no_mask_for_packed_rows(
    tiny_model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_dense_mask(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a dense mask was built")

    model = model_with(tiny_model_dir, "sdpa_varlen").train()
    monkeypatch.setattr(attention, "sdpa_mask", no_dense_mask)
    batch = packed(tokenize(RECORDS, tokenizer, 64), tokenizer.pad_token_id)
    forward(model, batch).loss.backward()


def test_the_collators_bounds_are_where_the_positions_restart(tokenizer: Any) -> None:
    batch = packed(tokenize(RECORDS * 2, tokenizer, 64), tokenizer.pad_token_id)
    rows, width = batch.inputs["input_ids"].shape
    from_bounds = segments(rows, width, None, batch.inputs["cu_seq_lens_q"])
    from_positions = segments(rows, width, batch.inputs["position_ids"], None)
    assert from_bounds == from_positions
    assert batch.max_length == max(b - a for row in from_bounds for a, b in row)
    assert all(row[0][0] == 0 and row[-1][1] == width for row in from_bounds)


def test_attention_is_chosen_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")
    assert choose_attention("auto", CPU, torch.float32) == "sdpa_varlen"
    assert choose_attention("sdpa", CPU, torch.float32) == "sdpa"
    with pytest.raises(AttentionUnavailable, match=r"training\.attention"):
        choose_attention("flex_attention", CPU, torch.float32)
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)
    assert choose_attention("auto", cuda, torch.bfloat16) == "flex_attention"
    with pytest.raises(AttentionUnavailable, match="flash_attn"):
        choose_attention("flash_attention_2", cuda, torch.bfloat16)
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    assert choose_attention("auto", cuda, torch.bfloat16) == "flash_attention_2"
    assert choose_attention("auto", cuda, torch.float32) == "flex_attention"  # flash: 16-bit


def test_prefetched_batches_are_the_samplers(tokenizer: Any) -> None:
    examples = tokenize(RECORDS * 4, tokenizer, 64)
    sampler = BatchSampler(examples, 3, tokenizer.pad_token_id, seed=1, pack_to=64)
    steps = StepBatches(sampler, per_step=2, device=CPU)
    steps.prefetch(2)
    for index in (2, 4, 0):
        got = steps.take(index)
        want = [sampler.batch(index), sampler.batch(index + 1)]
        assert [b.sources for b in got] == [b.sources for b in want]
        for g, w in zip(got, want, strict=True):
            assert all(torch.equal(g.inputs[k], w.inputs[k]) for k in w.inputs)


@CUDA_ONLY
@pytest.mark.parametrize("impl", ["flex_attention", "flash_attention_2"])
def test_gpu_paths_keep_examples_apart_and_match_the_dense_loss(
    impl: str, tiny_model_dir: Path, tokenizer: Any
) -> None:
    if impl == "flash_attention_2" and not attention.flash_attn_installed():
        pytest.skip("flash_attn is not installed")
    cuda = torch.device("cuda")
    examples = tokenize(RECORDS, tokenizer, 64)
    model = model_with(tiny_model_dir, impl, cuda, bf16=True).train()
    # bf16: looser than the CPU paths' fp32 tolerance.
    before = packed(examples, tokenizer.pad_token_id)
    where = spans(before)
    changed = first_with_neighbours(where)
    with torch.no_grad():
        ref = forward(model, before, cuda, True).logits.float()
        out = forward(model, packed(altered(examples, changed), tokenizer.pad_token_id), cuda, True)
    for s, (row, a, b) in where.items():
        if s != changed:
            assert torch.allclose(out.logits.float()[row, a:b], ref[row, a:b], atol=2e-2), s
    loss = forward(model, before, cuda, True).loss
    loss.backward()
    dense = model_with(tiny_model_dir, "sdpa", cuda, bf16=True).train()
    assert abs(float(loss) - float(forward(dense, before, cuda, True).loss)) < 2e-2

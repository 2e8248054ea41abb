"""DPO: its data formats, its batch, and a loss and gradients equal to independent ones (TRL's
``DPOTrainer`` on the same batch; the DPO paper's formula from each sequence's own forward)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.methods import DpoMethod
from swarm_trainer.data import IGNORE_INDEX, DatasetError, Example
from swarm_trainer.methods import Dpo, for_job
from swarm_trainer.methods.dpo import Pair, PairBatch, collate_pairs, encode_pair, sequence_logps
from swarm_trainer.model import build_model

BETA = 0.1
RECORDS = [
    {
        "prompt": f"Question: what is {i} plus {i}? Answer:",
        "chosen": f" {2 * i}.",
        "rejected": f" {2 * i + 1}, or so.",
    }
    for i in range(4)
]


def lora_model(model_dir: Path, *, random_b: bool = True) -> Any:
    torch.manual_seed(0)
    model = build_model(
        model_dir, LoraSpec(dropout=0.0, target_modules="all-linear"), TrainingSpec()
    )
    if random_b:
        perturb(model)
    return model.train()


def perturb(model: Any, adapter: str = "default") -> None:
    """B starts at zero (the policy is the reference); a random B makes rewards non-zero."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and f".{adapter}." in name:
                p.normal_(std=0.05)


def grads(model: Any) -> dict[str, torch.Tensor]:
    found = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return found


def trl_inputs(pairs: list[Pair], pad_id: int) -> dict[str, torch.Tensor]:
    """The same sequences in TRL's layout: every chosen row, then every rejected row, right
    padded; ``completion_mask`` marks the answer tokens (our targets)."""
    rows: list[Example] = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    width = max(len(e.input_ids) for e in rows)
    ids = torch.full((len(rows), width), pad_id)
    attention = torch.zeros_like(ids)
    completion = torch.zeros_like(ids)
    for r, e in enumerate(rows):
        n = len(e.input_ids)
        ids[r, :n] = torch.tensor(e.input_ids)
        attention[r, :n] = 1
        completion[r, :n] = torch.tensor([int(label != IGNORE_INDEX) for label in e.labels])
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def trl_trainer(model: Any, tokenizer: Any, tmp_path: Path) -> Any:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path / "trl"),
        beta=BETA,
        report_to=[],
        use_cpu=True,
        logging_strategy="no",
        save_strategy="no",
        max_length=64,
    )
    # TRL keeps a copy of an adapter it is given as its reference ("ref").
    return DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(RECORDS),
        processing_class=tokenizer,
    )


def test_the_three_formats_make_the_same_pair(tokenizer: Any) -> None:
    prompt = [{"role": "user", "content": "what is 2 plus 2?"}]
    chat = {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
    openai = {
        "input": {"messages": prompt},
        "preferred_output": [{"role": "assistant", "content": "4"}],
        "non_preferred_output": [{"role": "assistant", "content": "5"}],
    }
    shorthand = {"prompt": prompt, "chosen": "4", "rejected": "5"}
    pairs = [encode_pair(r, tokenizer, 64) for r in (chat, openai, shorthand)]
    assert pairs[0] is not None
    assert pairs[0] == pairs[1] == pairs[2]

    # Both sequences share the prompt; only the answer and EOS are targets.
    pair = encode_pair({"prompt": "Q: 2+2?", "chosen": " 4", "rejected": " 5"}, tokenizer, 64)
    assert pair is not None
    head = 1 + len(tokenizer.encode("Q: 2+2?", add_special_tokens=False))
    for e, answer in ((pair.chosen, " 4"), (pair.rejected, " 5")):
        assert e.input_ids[:head] == pair.chosen.input_ids[:head]
        assert e.labels[:head] == [IGNORE_INDEX] * head
        ids = tokenizer.encode(answer, add_special_tokens=False)
        assert e.labels[head:] == [*ids, tokenizer.eos_token_id]


def test_bad_records_and_pairs_cut_away_are_refused(tokenizer: Any) -> None:
    method = Dpo(BETA, reference=None)  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match="example 2: unsupported example with keys"):
        method.encode([RECORDS[0], {"prompt": "x", "completion": "y"}], tokenizer, 64)
    with pytest.raises(DatasetError, match="example 1: preferred_output must be"):
        method.encode(
            [{"input": {"messages": []}, "preferred_output": 3, "non_preferred_output": []}],
            tokenizer,
            64,
        )
    # A prompt longer than seq_len leaves no answer token: the pair goes, and with it all.
    long = {"prompt": "word " * 50, "chosen": " a", "rejected": " b"}
    assert encode_pair(long, tokenizer, 16) is None
    with pytest.raises(DatasetError, match="no preference pair"):
        method.encode([long], tokenizer, 16)


def test_each_target_knows_its_sequence_packed_or_padded(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    model = lora_model(tiny_model_dir).eval()
    method = for_job(DpoMethod(type="dpo"), model, from_parent=False)
    pairs = method.encode(RECORDS, tokenizer, 64)
    packed = collate_pairs(pairs, tokenizer.pad_token_id, 64 * 8)
    padded = collate_pairs(pairs, tokenizer.pad_token_id, None)
    assert isinstance(packed, PairBatch)
    assert packed.predicting is not None  # one row: logits only at the targets
    assert packed.inputs["input_ids"].shape[0] == 1
    assert padded.inputs["input_ids"].shape[0] == 2 * len(pairs)
    assert packed.sources == padded.sources == [0, 1, 2, 3]

    # Each sequence alone, through the plain model: the sum of its answer tokens' log-probs.
    alone = []
    with torch.no_grad():
        for pair in pairs:
            for e in (pair.chosen, pair.rejected):
                logits = model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
                labels = torch.tensor(e.labels[1:])
                kept = labels != IGNORE_INDEX
                logps = logits[kept].log_softmax(-1).gather(1, labels[kept, None])
                alone.append(logps.sum())
        expected = torch.stack(alone)
        for batch in (packed, padded):
            torch.testing.assert_close(sequence_logps(model, batch), expected)


def test_loss_and_gradients_equal_trls_dpo_trainer(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """TRL's ``DPOTrainer.compute_loss`` on the same sequences, with the base model as the
    reference (TRL's copy of the fresh adapter, B = 0), and the same measures."""
    model = lora_model(tiny_model_dir, random_b=False)
    trainer = trl_trainer(model, tokenizer, tmp_path)
    perturb(model)  # the trained adapter moves; TRL's "ref" copy stays the base model
    method = for_job(DpoMethod(type="dpo", beta=BETA), model, from_parent=False)
    pairs = method.encode(RECORDS, tokenizer, 64)
    batch = collate_pairs(pairs, tokenizer.pad_token_id, 64 * 8)

    ours, stats = method.loss(model, batch, batch.pairs, select_logits=True)
    ours.backward()
    our_grads = grads(model)
    theirs = trainer.compute_loss(model, trl_inputs(pairs, tokenizer.pad_token_id))
    theirs.backward()
    their_grads = grads(model)

    torch.testing.assert_close(ours, theirs)
    assert our_grads.keys() == their_grads.keys()
    assert len(our_grads) > 0
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], rtol=1e-4, atol=1e-7)
    measured = method.step_metrics(stats, batch.pairs)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert measured["reward_accuracy"] == pytest.approx(logged["rewards/accuracies"])
    assert measured["chosen_reward"] == pytest.approx(logged["rewards/chosen"], abs=1e-6)
    assert measured["rejected_reward"] == pytest.approx(logged["rewards/rejected"], abs=1e-6)
    assert measured["margin"] == pytest.approx(logged["rewards/margins"], abs=1e-6)
    assert abs(measured["margin"]) > 1e-4  # the rewards are not trivially zero


def test_a_parent_adapter_is_the_reference_as_in_trl(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """Continuing an adapter: the reference is the parent's weights as loaded, which TRL keeps
    as its "ref" adapter; training moves the weights, the reference stays."""
    model = lora_model(tiny_model_dir)  # the parent: a trained adapter
    method = for_job(DpoMethod(type="dpo", beta=BETA), model, from_parent=True)
    trainer = trl_trainer(model, tokenizer, tmp_path)
    perturb(model)  # training moved it since
    pairs = method.encode(RECORDS, tokenizer, 64)
    batch = collate_pairs(pairs, tokenizer.pad_token_id, 64 * 8)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    ours, _ = method.loss(model, batch, batch.pairs, select_logits=True)
    ours.backward()
    our_grads = grads(model)
    # The reference's weights were put back: the policy is as it was.
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, before[name]), name
    theirs = trainer.compute_loss(model, trl_inputs(pairs, tokenizer.pad_token_id))
    theirs.backward()
    their_grads = grads(model)
    torch.testing.assert_close(ours, theirs)
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], rtol=1e-4, atol=1e-7)


def test_loss_and_gradients_equal_the_papers_formula(tiny_model_dir: Path, tokenizer: Any) -> None:
    """The DPO paper's loss from raw log-probs of each sequence run alone, the reference with
    the adapter disabled; two micro-batches accumulated make the same step as one."""
    model = lora_model(tiny_model_dir)
    method = for_job(DpoMethod(type="dpo", beta=BETA), model, from_parent=False)
    pairs = method.encode(RECORDS, tokenizer, 64)

    def logp(e: Example) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
        labels = torch.tensor(e.labels[1:])
        kept = labels != IGNORE_INDEX
        return logits[kept].log_softmax(-1).gather(1, labels[kept, None]).sum()

    with torch.no_grad(), model.disable_adapter():
        ref = [(logp(p.chosen), logp(p.rejected)) for p in pairs]
    terms = [
        -F.logsigmoid(BETA * ((logp(p.chosen) - rc) - (logp(p.rejected) - rr)))
        for p, (rc, rr) in zip(pairs, ref, strict=True)
    ]
    expected = torch.stack(terms).mean()
    expected.backward()
    expected_grads = grads(model)

    halves = [collate_pairs(pairs[:2], 0, 64 * 4), collate_pairs(pairs[2:], 0, 64 * 4)]
    total = method.step_total(halves)
    assert total == len(pairs)
    step_loss = torch.zeros(())
    for batch in halves:
        loss, _ = method.loss(model, batch, total, select_logits=True)
        loss.backward()
        step_loss += loss.detach()
    torch.testing.assert_close(step_loss, expected.detach())
    for name, grad in grads(model).items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-7)

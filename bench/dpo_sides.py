"""The two sides of ``train_throughput.py --method dpo``: Swarm's DPO step against TRL's
``DPOTrainer``, on the same random Llama, preference pairs, LoRA, beta and schedule.

* **swarm-dpo**: ``step.train_step`` with ``methods.Dpo`` over ``BatchSampler`` micro-batches
  of pairs, both sequences of every pair packed in one row (the trainer's choice on CPU), the
  reference the same model with the adapter disabled;
* **trl-dpo**: TRL's ``DPOTrainer`` (sigmoid loss) with the adapter made by TRL from the same
  ``LoraConfig`` (its reference: the adapter disabled, as Swarm's), its own preference
  collator (chosen and rejected rows right-padded). TRL 1.16's ``padding_free`` is
  "temporarily unavailable" (it warns and pads), so padded rows are its fastest CPU
  configuration; ``precompute_ref_log_probs`` would move the reference's forwards before
  training rather than save them, so both sides compute the reference per step.

Pairs: ``train_throughput.make_data``'s prompts, the chosen answer its rule's completion, the
rejected one random tokens of a log-normal length. Tokens counted alike on both sides: every
real token of both sequences of every pair (a prompt counts twice, as both sides run it
twice). Both sides' final adapters are scored with the same DPO eval loss on held-out pairs.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BETA = 0.1


def make_pairs(run: Any, n: int, seed: int) -> list[dict[str, list[int]]]:
    from train_throughput import make_data

    rng = random.Random(seed + 1000)
    top = min(run.workload.shape["vocab_size"] - 12, 32000)
    pairs = []
    for r in make_data(run, n, seed):
        length = max(2, min(len(r["completion"]) * 2, int(rng.lognormvariate(3.0, 0.7))))
        rejected = [rng.randrange(10, top) for _ in range(length - 1)] + [2]
        room = run.seq_len - len(r["prompt"])
        pairs.append(
            {"prompt": r["prompt"], "chosen": r["completion"][:room], "rejected": rejected[:room]}
        )
    return pairs


def swarm_pairs(records: list[dict[str, list[int]]]) -> list[Any]:
    from swarm_trainer.data import IGNORE_INDEX, Example
    from swarm_trainer.methods.dpo import Pair

    def sequence(prompt: list[int], answer: list[int], i: int) -> Example:
        return Example(prompt + answer, [IGNORE_INDEX] * len(prompt) + answer, i)

    return [
        Pair(sequence(r["prompt"], r["chosen"], i), sequence(r["prompt"], r["rejected"], i), i)
        for i, r in enumerate(records)
    ]


@torch.no_grad()
def dpo_eval_loss(model: Any, run: Any) -> float:
    """Swarm's DPO evaluation (loss over held-out pairs, reference: the adapter disabled)."""
    from swarm_trainer.methods.dpo import Dpo, Reference, collate_pairs

    method = Dpo(BETA, Reference(model))
    pairs = swarm_pairs(make_pairs(run, 32, 2))
    sums = torch.zeros(method.eval_sums, dtype=torch.float64)
    model.eval()
    for i in range(0, len(pairs), run.batch):
        sums += method.eval_stats(model, collate_pairs(pairs[i : i + run.batch], 0, None))
    return method.evaluated(sums.tolist()).loss


def run_swarm_dpo(model_dir: Path, run: Any) -> dict[str, Any]:
    from train_throughput import LORA, LR, SEED, WARMUP, sync, timed

    from swarm_contracts.jobs import LoraSpec, TrainingSpec
    from swarm_trainer.compute import choose_compute
    from swarm_trainer.data import BatchSampler, StepBatches
    from swarm_trainer.methods.dpo import Dpo, Reference
    from swarm_trainer.model import build_model
    from swarm_trainer.step import lr_lambda, make_optimizer, train_step

    device = torch.device(run.device)
    compute = choose_compute(TrainingSpec(), device)
    torch.manual_seed(SEED)
    model = build_model(model_dir, LoraSpec(**LORA), TrainingSpec(), compute=compute)
    model = model.to(device).train()
    method = Dpo(BETA, Reference(model))
    opt = make_optimizer((p for p in model.parameters() if p.requires_grad), LR, device)
    total = run.untimed + run.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(WARMUP, total, floor=0.0))
    row = compute.packed_row(run.seq_len, run.batch * method.sequences)
    pairs = swarm_pairs(make_pairs(run, 2000, 1))
    sampler = BatchSampler(pairs, run.batch, 0, SEED, pack_to=row, collate=method.collate)
    batches = StepBatches(sampler, 1, device)
    tokens, losses = [], []
    started = (0.0, 0.0)
    for step in range(total):
        if step == run.untimed:
            sync(run)
            started = (time.perf_counter(), time.process_time())
        out = train_step(
            model,
            batches.take(step),
            opt,
            sched,
            1.0,
            device,
            compute.bf16,
            not compute.liger,
            method=method,
        )
        batches.prefetch(step + 1)
        tokens.append(out.tokens)
        losses.append(out.loss)
    result = timed(run, tokens, started)
    return result | {
        "attention": compute.attention,
        "liger": compute.liger,
        "train_loss": statistics.fmean(losses[-5:]),
        "eval_loss": dpo_eval_loss(model, run),
    }


def run_trl_dpo(model_dir: Path, run: Any) -> dict[str, Any]:
    from datasets import Dataset
    from peft import LoraConfig
    from train_throughput import LORA, LR, SEED, WARMUP, sync, timed
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from swarm_trainer.tiny_model import build_char_tokenizer

    class PreTokenized(DPOTrainer):  # type: ignore[misc]
        """The pairs come as token ids (``prompt_ids``, ``chosen_ids``, ``rejected_ids``,
        what TRL's own tokenization makes), so that both sides train on the same tokens."""

        def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            return dataset

    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_pretrained(
        model_dir,
        use_safetensors=True,
        dtype=torch.bfloat16 if run.cuda else torch.float32,
        attn_implementation="sdpa",
    )
    lora = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    rows = [
        {"prompt_ids": r["prompt"], "chosen_ids": r["chosen"], "rejected_ids": r["rejected"]}
        for r in make_pairs(run, 2000, 1)
    ]
    tokens: list[int] = []
    collate = DataCollatorForPreference(pad_token_id=0)

    def collator(batch: list[dict[str, Any]]) -> dict[str, Any]:
        out = collate(batch)
        tokens.append(int(out["attention_mask"].sum()))
        return out

    started = [0.0, 0.0]

    class Timer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == run.untimed:
                sync(run)
                started[:] = [time.perf_counter(), time.process_time()]

    args = DPOConfig(
        output_dir=tempfile.mkdtemp(),
        max_steps=run.untimed + run.steps,
        per_device_train_batch_size=run.batch,
        learning_rate=LR,
        warmup_steps=WARMUP,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=SEED,
        beta=BETA,
        loss_type=["sigmoid"],
        max_length=run.seq_len,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=not run.cuda,
        bf16=run.cuda,
        dataloader_num_workers=0,
    )
    trainer = PreTokenized(
        model=base,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=build_char_tokenizer(),
        data_collator=collator,
        peft_config=lora,
        callbacks=[Timer()],
    )
    if run.untimed == 0:
        started[:] = [time.perf_counter(), time.process_time()]
    trainer.train()
    result = timed(run, tokens, (started[0], started[1]))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return result | {
        "attention": "sdpa",
        "liger": False,
        "train_loss": statistics.fmean(losses[-5:]),
        "eval_loss": dpo_eval_loss(trainer.model, run),
    }

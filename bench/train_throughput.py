"""Swarm's training step vs the Hugging Face ``Trainer`` + peft: tokens/s, memory, loss.

Same random Llama (hidden 256, 6 layers), same generated prompt/completion data with
long-tailed (log-normal) lengths like real instruction sets, same steps, batch, LoRA and
schedule. Swarm runs ``recipe.train_step`` over ``BatchSampler`` micro-batches with packing,
in-process without Ray (Ray only adds start-up, not per-step work). Each side runs in its
own subprocess so that its peak RSS is its own.

    .venv/bin/python bench/train_throughput.py [--steps 40]

FLOPs: 4 * N per real token (N = base parameter count): forward 2N, backward through the
frozen base 2N for activation gradients only (LoRA weight gradients are negligible).
Attention score FLOPs are left out, so achieved FLOP/s is a slight under-estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SEQ_LEN, BATCH, LR, WARMUP, SEED = 512, 8, 2e-4, 5, 0
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}


def make_model(out: Path) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    from swarm_trainer.tiny_model import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=SEQ_LEN,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_data(n: int, seed: int) -> list[dict[str, list[int]]]:
    """Token-level prompt/completion pairs; a learnable rule (completion = prompt tail + 1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = min(SEQ_LEN, max(16, int(rng.lognormvariate(4.4, 0.7))))  # median ~80
        p = max(4, length // 2)
        prompt = [1] + [rng.randrange(10, 500) for _ in range(p - 1)]
        tail = [(t + 1) % 500 + 10 for t in prompt[-(length - p) :]][: length - p]
        completion = [*tail, 2]
        out.append({"prompt": prompt, "completion": completion})
    return out


def examples(records: list[dict[str, list[int]]]) -> list[Any]:
    from swarm_trainer.data import IGNORE_INDEX, Example

    return [
        Example(
            r["prompt"] + r["completion"],
            [IGNORE_INDEX] * len(r["prompt"]) + r["completion"],
            i,
        )
        for i, r in enumerate(records)
    ]


@torch.no_grad()
def eval_loss(model: torch.nn.Module, val: list[Any]) -> float:
    from swarm_trainer.data import collate

    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(val), BATCH):
        b = collate(val[i : i + BATCH], 0).inputs
        k = int((b["labels"][:, 1:] != -100).sum())
        total += float(model(**b, use_cache=False).loss) * k
        n += k
    return total / n


def run_swarm(model_dir: Path, steps: int) -> dict[str, Any]:
    from swarm_common.jobs import LoraSpec, TrainingSpec
    from swarm_trainer.data import BatchSampler
    from swarm_trainer.recipe import build_model, lr_lambda, train_step

    torch.manual_seed(SEED)
    model = build_model(model_dir, LoraSpec(**LORA), TrainingSpec()).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(WARMUP, steps, floor=0.0))
    sampler = BatchSampler(examples(make_data(2000, 1)), BATCH, 0, SEED, pack_to=SEQ_LEN)
    cpu = torch.device("cpu")
    tokens, losses = 0, []
    start = time.perf_counter()
    for step in range(steps):
        out = train_step(model, [sampler.batch(step)], opt, sched, 1.0, cpu)
        tokens, losses = tokens + out.tokens, [*losses, out.loss]
    elapsed = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "train_loss": sum(losses[-5:]) / 5,
        "eval_loss": eval_loss(model, examples(make_data(64, 2))),
    }


def run_hf(model_dir: Path, steps: int) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    lora = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    rows = [{"input_ids": e.input_ids, "labels": e.labels} for e in examples(make_data(2000, 1))]
    counted = {"tokens": 0}

    def collator(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        # What DataCollatorForSeq2Seq does: pad to the batch's longest, labels with -100.
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = (
                torch.tensor(b["input_ids"]),
                torch.tensor(b["labels"]),
                1,
            )
        counted["tokens"] += int(mask.sum())
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        warmup_steps=WARMUP,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=SEED,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=collator,  # type: ignore[arg-type]
    )
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "tokens": counted["tokens"],
        "seconds": elapsed,
        "train_loss": sum(losses[-5:]) / 5,
        "eval_loss": eval_loss(model, examples(make_data(64, 2))),
    }


def child(which: str, model_dir: Path, steps: int) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    result = (run_swarm if which == "swarm" else run_hf)(model_dir, steps)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def matmul_peak() -> float:
    torch.set_num_threads(os.cpu_count() or 1)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    start, n = time.perf_counter(), 10
    for _ in range(n):
        a @ b
    return 2 * 2048**3 * n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--child", choices=["swarm", "hf"])
    parser.add_argument("--model-dir", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model_dir, args.steps)
        return
    model_dir = Path(tempfile.mkdtemp()) / "model"
    n_params = make_model(model_dir)
    results = {}
    for which in ("hf", "swarm"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                which,
                "--model-dir",
                str(model_dir),
                "--steps",
                str(args.steps),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            sys.exit(f"the {which} run failed:\n{proc.stderr[-4000:]}")
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        results[which] = json.loads(line[len("RESULT ") :])
    peak = matmul_peak()
    print(
        f"machine: {os.cpu_count()} CPU threads, torch {torch.__version__}; "
        f"base params N={n_params / 1e6:.2f}M; steps={args.steps}, batch={BATCH}, "
        f"seq_len={SEQ_LEN}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s"
    )
    print(
        f"{'':22}{'tokens/s':>10}{'GFLOP/s':>9}{'%peak':>7}{'peak RSS MB':>13}"
        f"{'train loss':>12}{'eval loss':>11}"
    )
    for which, label in (("hf", "HF Trainer + peft"), ("swarm", "Swarm (packed)")):
        r = results[which]
        tps = r["tokens"] / r["seconds"]
        flops = 4 * n_params * tps
        print(
            f"{label:22}{tps:10.0f}{flops / 1e9:9.1f}{100 * flops / peak:7.1f}"
            f"{r['peak_rss_mb']:13.0f}{r['train_loss']:12.4f}{r['eval_loss']:11.4f}"
        )
    ratio = (results["swarm"]["tokens"] / results["swarm"]["seconds"]) / (
        results["hf"]["tokens"] / results["hf"]["seconds"]
    )
    print(f"Swarm / HF tokens/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()

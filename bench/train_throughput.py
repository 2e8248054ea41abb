"""Swarm's training step vs the Hugging Face ``Trainer`` + peft: tokens/s, MFU, memory, loss.

Each side runs in its own subprocess (so its peak memory is its own), interleaved
(swarm, a, b, swarm, a, b, ...) ``--repeats`` times, since machines are noisy; a ratio is the
median of the per-round ratios:

* **swarm**: ``step.train_step`` over packed ``BatchSampler`` micro-batches, with what the
  trainer chooses for the device (``compute.choose_compute``: precision, attention, Liger
  where installed), ``step.make_optimizer`` (fused AdamW on CUDA) and ``StepBatches`` (the
  next step's batch collated and sent while the device works), in-process without Ray (Ray
  adds start-up, not per-step work);
* **hf-padded** (a): ``Trainer`` + peft, rows padded to the batch's longest example, sdpa;
* **hf-flat** (b): ``Trainer`` + peft with padding-free flattening
  (``DataCollatorWithFlattening``: the batch as one row, positions restarting per example)
  and the fastest stock attention for the device: ``flash_attention_2`` where installed, else
  ``flex_attention`` on CUDA; ``sdpa`` on CPU (PyTorch has no CPU backward for flex
  attention); Liger Kernel on CUDA where installed;
* **swarm-qlora** (CUDA only, where bitsandbytes is installed): the swarm side with the base
  in 4-bit NF4 (``lora.quantize: nf4``), for its peak memory.

``--method dpo`` compares DPO instead: Swarm's DPO step against TRL's ``DPOTrainer``
(``bench/dpo_sides.py`` says how), same model, pairs, LoRA, beta and schedule.

On CUDA each Swarm side also prints its memory estimate (what ``swarm jobs estimate`` and the
scheduler use) beside the measured peak.

Same random Llama, same generated prompt/completion data with log-normal lengths (the long
tail of real instruction sets), same steps, batch, LoRA (r 16 / alpha 32, all linear layers)
and schedule (AdamW 2e-4, 5 warmup steps, cosine, clipping at 1.0) on every side. The first
``--untimed`` steps (compilation, allocator warm-up) are not timed.

    CPU:  .venv/bin/python bench/train_throughput.py [--steps 40] [--repeats 3] [--threads 1]
          .venv/bin/python bench/train_throughput.py --method dpo [--steps 20]
    GPU:  .venv/bin/python bench/train_throughput.py --device cuda --model 1b|8b

GPU shapes: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads / 8 KV, vocab 128256, tied
embeddings) at seq_len 2048, and Llama-3-8B (hidden 4096, 32 layers, 32 / 8, vocab 128256) at
seq_len 4096, batch 16, median example ~400 tokens; random bf16 weights made locally.
CPU: a small Llama (hidden 256, 6 layers, vocab 512), seq_len 512, batch 8, median ~80.

FLOPs: 4 * N per real (non-pad) token, N = the base's matmul parameters (the input
embedding table is a lookup, not a matmul, unless tied to the output layer): forward 2N,
backward through the frozen base 2N for activation gradients only (LoRA weight gradients
are negligible); attention scores are left out, so MFU is a slight under-estimate. MFU is
given against the datasheet peak (GPU) and against a matmul measured in the same run (8192^3
bf16 on GPU, 2048^2 fp32 on CPU).

Long because: a standalone benchmark whose three sides must run the same data and the same
measurements, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

LR, WARMUP, SEED = 2e-4, 5, 0
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
SIDES = ("swarm", "hf-padded", "hf-flat", "swarm-qlora", "swarm-dpo", "trl-dpo")
# Each method's sides: Swarm's first, then the peers it is compared with.
METHOD_SIDES = {
    "sft": ("swarm", "hf-padded", "hf-flat", "swarm-qlora"),
    "dpo": ("swarm-dpo", "trl-dpo"),
}
LABELS = {
    "swarm": "Swarm (packed)",
    "hf-padded": "HF + peft, padded (a)",
    "hf-flat": "HF + peft, flattened (b)",
    "swarm-qlora": "Swarm QLoRA (NF4 base)",
    "swarm-dpo": "Swarm DPO (packed)",
    "trl-dpo": "TRL DPOTrainer (padded)",
}
QUANTIZE = {"swarm-qlora": "nf4"}  # lora.quantize of each Swarm side that has one
# Dense bf16 tensor-core peaks from the datasheets (SXM parts), FLOP/s.
DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


@dataclass(frozen=True)
class Workload:
    shape: dict[str, Any]  # LlamaConfig fields
    seq_len: int
    batch: int
    log_median: float  # log of the median example length (log-normal lengths)


WORKLOADS = {
    "cpu": Workload(
        dict(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=512,
            tie_word_embeddings=False,
        ),
        seq_len=512,
        batch=8,
        log_median=4.4,  # ~80 tokens
    ),
    "1b": Workload(
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        ),
        seq_len=2048,
        batch=16,
        log_median=6.0,  # ~400 tokens
    ),
    "8b": Workload(
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=False,
            rope_theta=500000.0,
        ),
        seq_len=4096,
        batch=16,
        log_median=6.0,
    ),
}


@dataclass(frozen=True)
class Run:
    device: str
    model: str
    steps: int
    untimed: int
    seq_len: int
    batch: int

    @property
    def workload(self) -> Workload:
        return WORKLOADS[self.model]

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def make_model(run: Run, out: Path) -> int:
    """A random Llama of the run's shape, saved as safetensors; returns N (matmul params)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **run.workload.shape,
        max_position_embeddings=max(run.seq_len, 512),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(SEED)
    dtype = torch.bfloat16 if run.cuda else torch.float32
    # Made on the GPU where there is one: initialising 8B parameters on CPU takes minutes.
    with torch.device(run.device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    total = sum(p.numel() for p in model.parameters())
    lookup = 0 if config.tie_word_embeddings else model.get_input_embeddings().weight.numel()
    del model
    if run.cuda:
        torch.cuda.empty_cache()  # the sides run in their own processes
    return total - lookup


def make_data(run: Run, n: int, seed: int) -> list[dict[str, list[int]]]:
    """Token-level prompt/completion pairs; a learnable rule (completion = prompt tail + 1)."""
    rng = random.Random(seed)
    # Ids below 10 are special; completions map t to (t + 1) % top + 10, inside the vocabulary.
    top = min(run.workload.shape["vocab_size"] - 12, 32000)
    out = []
    for _ in range(n):
        length = min(run.seq_len, max(16, int(rng.lognormvariate(run.workload.log_median, 0.7))))
        p = max(4, length // 2)
        prompt = [1] + [rng.randrange(10, top) for _ in range(p - 1)]
        tail = [(t + 1) % top + 10 for t in prompt[-(length - p) :]][: length - p]
        out.append({"prompt": prompt, "completion": [*tail, 2]})
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


def sync(run: Run) -> None:
    if run.cuda:
        torch.cuda.synchronize()


@torch.no_grad()
def eval_loss(model: torch.nn.Module, run: Run) -> float:
    from swarm_trainer.data import collate

    val = examples(make_data(run, 64, 2))
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(val), run.batch):
        batch = collate(val[i : i + run.batch], 0)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=run.cuda):
            out = model(**batch.to(torch.device(run.device)).model_inputs(), use_cache=False)
        total += float(out.loss) * batch.targets
        n += batch.targets
    return total / n


def timed(run: Run, tokens: list[int], started: tuple[float, float]) -> dict[str, Any]:
    sync(run)
    wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
    counted = sum(tokens[run.untimed : run.untimed + run.steps])
    return {"tokens": counted, "seconds": wall, "cpu_seconds": cpu}


def memory_estimate_gb(model_dir: Path, run: Run, side: str) -> float:
    """What ``swarm jobs estimate`` says a Swarm side's peak GPU memory is: the model's shape
    read as the registry reads it (config.json and the safetensors headers)."""
    from swarm_contracts.jobs import JobSpec, LoraSpec, TrainingSpec
    from swarm_contracts.memory import ModelShape
    from swarm_contracts.memory_estimate import estimate_memory
    from swarm_registry.inspection import safetensors_header, tensor_elements, weights_dtype
    from swarm_runtime.store import LocalStore

    store, elements = LocalStore(model_dir), Counter[str]()
    for file in model_dir.glob("*.safetensors"):
        elements.update(tensor_elements(file.name, safetensors_header(store, file.name)))
    config = json.loads((model_dir / "config.json").read_text())
    shape = ModelShape.from_config(config, sum(elements.values()), weights_dtype(elements))
    assert shape is not None, "the benchmark's model is a Llama"
    spec = JobSpec(
        name="bench",
        base_model="bench",
        dataset="ds-" + "0" * 16,
        lora=LoraSpec(**LORA, quantize=QUANTIZE.get(side)),
        training=TrainingSpec(batch_size=run.batch, seq_len=run.seq_len),
    )
    return estimate_memory(shape, spec).total_gb


def run_swarm(model_dir: Path, run: Run, side: str) -> dict[str, Any]:
    from swarm_contracts.jobs import LoraSpec, TrainingSpec
    from swarm_trainer.compute import choose_compute
    from swarm_trainer.data import BatchSampler, StepBatches
    from swarm_trainer.model import build_model
    from swarm_trainer.step import lr_lambda, make_optimizer, train_step

    device = torch.device(run.device)
    compute = choose_compute(TrainingSpec(), device)
    torch.manual_seed(SEED)
    quantize = QUANTIZE.get(side)
    lora = LoraSpec(**LORA, quantize=quantize)
    model = build_model(model_dir, lora, TrainingSpec(), compute=compute, device=device)
    # A 4-bit base is loaded onto the device, and bitsandbytes' weights are not to be moved.
    model = (model if quantize else model.to(device)).train()
    opt = make_optimizer((p for p in model.parameters() if p.requires_grad), LR, device)
    total = run.untimed + run.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(WARMUP, total, floor=0.0))
    row = compute.packed_row(run.seq_len, run.batch)
    sampler = BatchSampler(examples(make_data(run, 2000, 1)), run.batch, 0, SEED, pack_to=row)
    batches = StepBatches(sampler, 1, device)
    tokens, losses = [], []
    started = (0.0, 0.0)
    for step in range(total):
        if step == run.untimed:
            sync(run)
            started = (time.perf_counter(), time.process_time())
        out = train_step(
            model, batches.take(step), opt, sched, 1.0, device, compute.bf16, not compute.liger
        )
        batches.prefetch(step + 1)
        tokens.append(out.tokens)
        losses.append(out.loss)  # the step's one wait for the device, as in the trainer
    result = timed(run, tokens, started)
    return result | {
        "attention": compute.attention,
        "liger": compute.liger,
        "train_loss": statistics.fmean(losses[-5:]),
        "eval_loss": eval_loss(model, run),
    }


def hf_attention(run: Run, flat: bool) -> str:
    from swarm_trainer.attention import flash_attn_installed

    if not flat or not run.cuda:
        return "sdpa"
    return "flash_attention_2" if flash_attn_installed() else "flex_attention"


def run_hf(model_dir: Path, run: Run, flat: bool) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorWithFlattening,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from swarm_trainer.compute import liger_installed

    attention = hf_attention(run, flat)
    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_pretrained(
        model_dir,
        use_safetensors=True,
        dtype=torch.bfloat16 if run.cuda else torch.float32,
        attn_implementation=attention,
    )
    lora = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    rows = [
        {"input_ids": e.input_ids, "labels": e.labels} for e in examples(make_data(run, 2000, 1))
    ]
    tokens: list[int] = []
    flatten = DataCollatorWithFlattening(return_flash_attn_kwargs=attention == "flash_attention_2")

    def collator(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        tokens.append(sum(len(b["input_ids"]) for b in batch))
        if flat:
            return flatten(batch)
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
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    started = [0.0, 0.0]

    class Timer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == run.untimed:
                sync(run)
                started[:] = [time.perf_counter(), time.process_time()]

    liger = run.cuda and liger_installed()
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=run.untimed + run.steps,
        per_device_train_batch_size=run.batch,
        learning_rate=LR,
        warmup_steps=WARMUP,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=SEED,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=not run.cuda,
        bf16=run.cuda,
        use_liger_kernel=liger,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=collator,
        callbacks=[Timer()],
    )
    if run.untimed == 0:
        started[:] = [time.perf_counter(), time.process_time()]
    trainer.train()
    result = timed(run, tokens, (started[0], started[1]))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return result | {
        "attention": attention,
        "liger": liger,
        "train_loss": statistics.fmean(losses[-5:]),
        "eval_loss": eval_loss(model, run),
    }


def child(side: str, model_dir: Path, run: Run, threads: int) -> None:
    torch.set_num_threads(threads)
    if run.cuda:
        torch.cuda.reset_peak_memory_stats()
    if side in ("swarm-dpo", "trl-dpo"):
        # Imported here: TRL is needed for --method dpo only.
        from dpo_sides import run_swarm_dpo, run_trl_dpo

        result = (run_swarm_dpo if side == "swarm-dpo" else run_trl_dpo)(model_dir, run)
    elif side.startswith("swarm"):
        result = run_swarm(model_dir, run, side)
    else:
        result = run_hf(model_dir, run, flat=side == "hf-flat")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if run.cuda:
        result["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    print("RESULT " + json.dumps(result))


def matmul_peak(run: Run, threads: int) -> float:
    """FLOP/s of a large matmul on this device: what the hardware gives in this run."""
    torch.set_num_threads(threads)
    n, dtype = (8192, torch.bfloat16) if run.cuda else (2048, torch.float32)
    a = torch.randn(n, n, device=run.device, dtype=dtype)
    b = torch.randn(n, n, device=run.device, dtype=dtype)
    a @ b
    sync(run)
    start, reps = time.perf_counter(), 20 if run.cuda else 10
    for _ in range(reps):
        a @ b
    sync(run)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def datasheet_peak(run: Run) -> float | None:
    if not run.cuda:
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in DATASHEET_BF16.items() if key in name), None)


def spawn(side: str, model_dir: Path, run: Run, threads: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            side,
            "--model-dir",
            str(model_dir),
            "--run",
            json.dumps(asdict(run)),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.exit(f"the {side} run failed:\n{proc.stderr[-4000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--method", choices=list(METHOD_SIDES), default="sft")
    parser.add_argument("--model", choices=["1b", "8b"], help="GPU shape (CUDA only)")
    parser.add_argument("--steps", type=int, help="timed steps (40 on CPU, 30 on GPU)")
    parser.add_argument("--untimed", type=int, default=3, help="warm-up steps, not timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, help="default: all; swarm-qlora on CUDA only"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", choices=SIDES)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--run")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model_dir, Run(**json.loads(args.run)), args.threads)
        return
    if args.device == "cuda" and args.model is None:
        parser.error("--device cuda needs --model 1b or 8b")
    if args.device == "cpu" and args.model is not None:
        parser.error("--model is for --device cuda (the CPU mode has its own small shape)")
    shape = args.model or "cpu"
    if args.sides is None:
        # bitsandbytes' 4-bit kernels need CUDA.
        sides = METHOD_SIDES[args.method]
        args.sides = [s for s in sides if args.device == "cuda" or s != "swarm-qlora"]
    run = Run(
        device=args.device,
        model=shape,
        steps=args.steps or (30 if args.device == "cuda" else 40),
        untimed=args.untimed,
        seq_len=args.seq_len or WORKLOADS[shape].seq_len,
        batch=args.batch or WORKLOADS[shape].batch,
    )
    model_dir = Path(tempfile.mkdtemp()) / "model"
    n_params = make_model(run, model_dir)
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeats):
        rounds.append({})
        for side in args.sides:
            result = spawn(side, model_dir, run, args.threads)
            rounds[-1][side] = result
            tps = result["tokens"] / result["seconds"]
            print(f"round {r + 1} {side}: {tps:,.0f} tokens/s", flush=True)
    peak = matmul_peak(run, args.threads)
    sheet = datasheet_peak(run)
    report(run, args, n_params, rounds, peak, sheet)
    if run.cuda:
        for side in (s for s in args.sides if s in ("swarm", "swarm-qlora")):
            print(
                f"{LABELS[side]}: memory estimate (swarm jobs estimate) "
                f"{memory_estimate_gb(model_dir, run, side):.1f} GB, measured peak "
                f"{max(r[side]['peak_gpu_gb'] for r in rounds):.1f} GB"
            )


def report(
    run: Run,
    args: argparse.Namespace,
    n_params: int,
    rounds: list[dict[str, dict[str, Any]]],
    peak: float,
    sheet: float | None,
) -> None:
    where = torch.cuda.get_device_name() if run.cuda else f"{os.cpu_count()} CPU threads"
    print(
        f"machine: {where}, torch {torch.__version__}, {args.threads} torch threads; "
        f"shape {run.model}, N={n_params / 1e6:.2f}M; {run.steps} timed steps "
        f"(+{run.untimed} untimed), batch {run.batch}, seq_len {run.seq_len}; "
        f"measured matmul peak {peak / 1e12:.3f} TFLOP/s"
        + (f", datasheet {sheet / 1e12:.0f} TFLOP/s" if sheet else "")
    )
    memory = "peak GPU GB" if run.cuda else "peak RSS MB"
    print(
        f"{'':26}{'tokens/s':>10}{'tok/CPU-s':>10}{'MFU sheet':>10}{'MFU meas':>9}"
        f"{memory:>13}{'train loss':>11}{'eval loss':>10}  attention"
    )
    for side in args.sides:
        results = [r[side] for r in rounds]
        tps = statistics.median(r["tokens"] / r["seconds"] for r in results)
        cps = statistics.median(r["tokens"] / r["cpu_seconds"] for r in results)
        flops = 4 * n_params * tps
        mfu_sheet = f"{100 * flops / sheet:9.1f}%" if sheet else f"{'n/a':>10}"
        mem = max(r["peak_gpu_gb"] if run.cuda else r["peak_rss_mb"] for r in results)
        last = results[-1]
        print(
            f"{LABELS[side]:26}{tps:10.0f}{cps:10.0f}{mfu_sheet}{100 * flops / peak:8.1f}%"
            f"{mem:13.1f}{last['train_loss']:11.4f}{last['eval_loss']:10.4f}  "
            f"{last['attention']}{' + liger' if last['liger'] else ''}"
        )
    ours, *peers = METHOD_SIDES[args.method]
    if ours not in args.sides:
        return
    for peer in (s for s in peers if s in args.sides and s != "swarm-qlora"):
        ratios = [
            (r[ours]["tokens"] / r[ours]["seconds"]) / (r[peer]["tokens"] / r[peer]["seconds"])
            for r in rounds
        ]
        cpu_ratios = [
            (r[ours]["tokens"] / r[ours]["cpu_seconds"])
            / (r[peer]["tokens"] / r[peer]["cpu_seconds"])
            for r in rounds
        ]
        print(
            f"{LABELS[ours]} / {LABELS[peer]}: median {statistics.median(ratios):.2f}x tokens/s "
            f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); per CPU-second "
            f"{statistics.median(cpu_ratios):.2f}x"
        )


if __name__ == "__main__":
    main()

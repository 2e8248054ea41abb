"""Time and tokens to the target exact match on the demo's task: Swarm's trainer vs the Hugging
Face ``Trainer`` + peft, with padding-free flattening and with padding.

The task is ``swarm demo``'s (``swarm.demo_data``: a sentence about a person -> one fixed JSON
shape), on the same tiny base model pretrained by Swarm (``swarm models create-tiny``, cached),
with the demo's job spec (``swarm.demo.demo_spec``): its LoRA (r 16 / alpha 32, all linear
layers), batch, seq_len, learning rate, warmup and schedule length. Both sides train on
the same token ids and labels (``swarm_trainer.data.tokenize``), and both are graded every
``--eval-every`` steps by the same code (``swarm_trainer.task_eval.run_evals``: greedy
generation on the 40 held-out prompts, the ``exact_match`` grader), until the exact match
reaches ``--target`` (the demo's 0.8) or the schedule ends.

* **swarm**: the trainer's step (``step.train_step``) over packed ``BatchSampler``
  micro-batches, with what the trainer chooses for the device (``compute.choose_compute``),
  in-process without Ray (Ray adds start-up, not per-step work);
* **hf-flat**: ``Trainer`` + peft, ``DataCollatorWithFlattening`` (the batch as one row,
  positions restarting per example, no padding) and ``sdpa``, which on CPU attends over the
  whole row under a dense block-diagonal mask; the same AdamW (no weight decay) and the same
  schedule object (linear warmup, cosine to 0.1 of the peak: ``step.lr_lambda``), clipping
  at 1.0;
* **hf-padded**: the same, with rows padded to the batch's longest example instead: the demo's
  examples are all 101-107 tokens, so padding costs little and the attention is far smaller
  than the flattened row's; on this task it is HF's fastest CPU configuration.

Timed: training only, from the first step to the end of the step whose evaluation first
reached the target, in wall time and in the process's CPU time (on a shared machine the latter
moves far less with the neighbours' load); the evaluations (the same work on both sides) are
not in it and are printed apart. Tokens: real (non-pad) tokens trained on up to that step.
Each side runs in its own subprocess, interleaved (swarm, hf-flat, hf-padded, swarm, ...)
``--repeats`` rounds, round r with ``training.seed`` ``--seed`` + r on every side (the LoRA
initialisation and the data order: where exact match crosses the target moves with them); the
table gives medians, a ratio is the median of the per-round ratios.

    .venv/bin/python bench/quality.py [--repeats 3] [--eval-every 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

SIDES = ("swarm", "hf-flat", "hf-padded")
LABELS = {
    "swarm": "Swarm (packed)",
    "hf-flat": "HF + peft, flattened",
    "hf-padded": "HF + peft, padded",
}
METRIC = "exact_match"
FAKE_IDS = ("ds-" + "0" * 16, "ds-" + "1" * 16)  # the spec needs dataset ids; no store here


@dataclass(frozen=True)
class Setup:
    model_dir: str
    train_file: str
    held_out_file: str
    max_steps: int
    eval_every: int
    target: float
    threads: int
    seed: int  # training.seed: the LoRA weights' initialisation and the order of the data


@dataclass
class Outcome:
    """One side's run: what it reached, when, and at what cost."""

    reached_step: int | None = None  # the first evaluated step at or above the target
    train_s: float = 0.0  # training time up to that step (or to the end), evals excluded
    train_cpu_s: float = 0.0  # the process's CPU time over the same span
    tokens: int = 0  # real tokens trained on up to then
    eval_s: float = 0.0  # time spent in the evaluations, not in ``train_s``
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, exact match)


def job_spec(setup: Setup) -> Any:
    from swarm.demo import demo_spec
    from swarm_contracts.jobs import JobSpec

    spec = demo_spec(*FAKE_IDS, setup.max_steps)
    training = spec["training"]
    assert isinstance(training, dict)
    return JobSpec.model_validate(spec | {"training": training | {"seed": setup.seed}})


def load(setup: Setup) -> tuple[Any, Any, list[Any], list[Any]]:
    """(job spec, tokenizer, training examples, held-out eval rows), as the trainer makes them."""
    from transformers import AutoTokenizer

    from swarm_trainer.data import read_jsonl, tokenize
    from swarm_trainer.task_eval import eval_rows

    spec = job_spec(setup)
    tokenizer = AutoTokenizer.from_pretrained(setup.model_dir)
    records = read_jsonl(Path(setup.train_file))
    examples = tokenize(records, tokenizer, spec.training.seq_len)
    assert spec.evals is not None
    rows = eval_rows(read_jsonl(Path(setup.held_out_file)), spec.evals.max_examples)
    return spec, tokenizer, examples, rows


class Grading:
    """Evaluates every ``eval_every`` steps with the trainer's task evals, keeping its own
    time off the training clock."""

    def __init__(self, setup: Setup, spec: Any, tokenizer: Any, rows: list[Any]):
        self.setup, self.spec, self.tokenizer, self.rows = setup, spec, tokenizer, rows
        self.outcome = Outcome()
        self.started = (0.0, 0.0)
        self.tokens = 0

    def start(self) -> None:
        self.started = (time.perf_counter(), time.process_time())

    def after_step(self, model: Any, step: int, tokens: int) -> bool:
        """True once the target is reached (training stops there)."""
        from swarm_trainer.task_eval import run_evals

        self.tokens += tokens
        if step % self.setup.eval_every and step != self.setup.max_steps:
            return False
        paused = time.perf_counter()
        self.outcome.train_s += paused - self.started[0]
        self.outcome.train_cpu_s += time.process_time() - self.started[1]
        self.outcome.tokens = self.tokens
        result = run_evals(
            model, self.tokenizer, self.spec.evals, self.rows, step, torch.device("cpu")
        )
        value = result.metrics[METRIC]
        self.outcome.curve.append((step, value))
        print(f"  step {step}: {METRIC} {value:.3f}", file=sys.stderr, flush=True)
        self.start()
        self.outcome.eval_s += self.started[0] - paused
        if value >= self.setup.target:
            self.outcome.reached_step = step
            return True
        return False


def run_swarm(setup: Setup) -> Outcome:
    from swarm_trainer.compute import choose_compute
    from swarm_trainer.data import BatchSampler
    from swarm_trainer.model import build_model
    from swarm_trainer.rng import seed_everything
    from swarm_trainer.step import lr_lambda, make_optimizer, train_step

    spec, tokenizer, examples, rows = load(setup)
    t = spec.training
    cpu = torch.device("cpu")
    compute = choose_compute(t, cpu)
    seed_everything(t.seed)
    model = build_model(Path(setup.model_dir), spec.lora, t, compute=compute, device=cpu).train()
    optimizer = make_optimizer((p for p in model.parameters() if p.requires_grad), t.lr, cpu)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup_steps, t.max_steps))
    pack_to = compute.packed_row(t.seq_len, t.batch_size) if t.packing else None
    sampler = BatchSampler(examples, t.batch_size, tokenizer.pad_token_id, t.seed, pack_to)
    grading = Grading(setup, spec, tokenizer, rows)
    grading.start()
    for step in range(1, t.max_steps + 1):
        out = train_step(
            model, [sampler.batch(step - 1)], optimizer, schedule, t.max_grad_norm, cpu
        )
        if grading.after_step(model, step, out.tokens):
            break
    return grading.outcome


def run_hf(setup: Setup, flat: bool) -> Outcome:
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorWithFlattening,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from swarm_trainer.rng import seed_everything
    from swarm_trainer.step import lr_lambda

    spec, tokenizer, examples, rows = load(setup)
    t = spec.training
    seed_everything(t.seed)
    base = AutoModelForCausalLM.from_pretrained(
        setup.model_dir, use_safetensors=True, dtype=torch.float32, attn_implementation="sdpa"
    )
    lora = LoraConfig(
        r=spec.lora.r,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=spec.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=t.lr, weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup_steps, t.max_steps))
    data = [{"input_ids": e.input_ids, "labels": e.labels} for e in examples]
    flatten = DataCollatorWithFlattening()
    pad_id = tokenizer.pad_token_id
    counted: list[int] = []

    def collator(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        counted.append(sum(len(b["input_ids"]) for b in batch))
        return flatten(batch) if flat else padded(batch, pad_id)

    grading = Grading(setup, spec, tokenizer, rows)

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            grading.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            # The collator has run for this step (and no further: no prefetching workers).
            tokens = counted[step - 1]
            if grading.after_step(model, step, tokens):
                control.should_training_stop = True

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=t.max_steps,
        per_device_train_batch_size=t.batch_size,
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
        data_seed=t.seed,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collator,
        optimizers=(optimizer, schedule),
        callbacks=[Evaluate()],
    )
    trainer.train()
    return grading.outcome


def padded(batch: list[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """What ``DataCollatorForSeq2Seq`` does: pad to the batch's longest, labels with -100."""
    width = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[i, :n] = torch.tensor(b["input_ids"])
        labels[i, :n] = torch.tensor(b["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def child(side: str, setup: Setup) -> None:
    torch.set_num_threads(setup.threads)
    outcome = run_swarm(setup) if side == "swarm" else run_hf(setup, flat=side == "hf-flat")
    print("RESULT " + json.dumps(asdict(outcome)))


def spawn(side: str, setup: Setup) -> Outcome:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", side, "--setup", json.dumps(asdict(setup))],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.exit(f"the {side} run failed:\n{proc.stderr[-4000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    found = json.loads(line[len("RESULT ") :])
    found["curve"] = [tuple(p) for p in found["curve"]]
    return Outcome(**found)


def prepare(work: Path) -> tuple[Path, Path, Path]:
    """The demo's base model (from the cache once built) and datasets."""
    from swarm.demo_data import write_demo_datasets
    from swarm.tiny_model import create_tiny_model

    model_dir = work / "tiny-llama"
    create_tiny_model(model_dir)
    train, held_out = write_demo_datasets(work / "data")
    return model_dir, train, held_out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; round r trains with seed --seed + r"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=10, help="steps between gradings")
    parser.add_argument("--max-steps", type=int, default=400, help="the schedule (the demo's)")
    parser.add_argument("--target", type=float, help="exact match to reach (the demo's 0.8)")
    # One thread: on a shared 2-core VM two threads spin-wait on each other's core.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--child", choices=SIDES)
    parser.add_argument("--setup")
    args = parser.parse_args()
    if args.child:
        child(args.child, Setup(**json.loads(args.setup)))
        return
    from swarm.demo import ADAPTER_TARGET

    work = Path(tempfile.mkdtemp(prefix="swarm-quality-"))
    model_dir, train, held_out = prepare(work)
    setup = Setup(
        model_dir=str(model_dir),
        train_file=str(train),
        held_out_file=str(held_out),
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        target=args.target if args.target is not None else ADAPTER_TARGET,
        threads=args.threads,
        seed=args.seed,
    )
    rounds: list[dict[str, Outcome]] = []
    for r in range(args.repeats):
        rounds.append({})
        # Each round its own seed, the same on every side: where a metric as coarse as exact
        # match crosses the target moves by tens of steps with the data order alone.
        this = replace(setup, seed=args.seed + r)
        for side in args.sides:
            outcome = spawn(side, this)
            rounds[-1][side] = outcome
            print(f"round {r + 1} (seed {this.seed}) {side}: {describe(outcome)}", flush=True)
    report(setup, args.sides, rounds)


def describe(o: Outcome) -> str:
    best = max((v for _, v in o.curve), default=0.0)
    if o.reached_step is None:
        return f"target not reached in {o.train_s:.1f} s (best {METRIC} {best:.3f})"
    return (
        f"{METRIC} {best:.3f} at step {o.reached_step}: {o.train_s:.1f} s training "
        f"({o.train_cpu_s:.1f} CPU s), {o.tokens:,} tokens ({o.eval_s:.1f} s evaluating)"
    )


def report(setup: Setup, sides: list[str], rounds: list[dict[str, Outcome]]) -> None:
    print(
        f"machine: {os.cpu_count()} CPU threads, torch {torch.__version__}, "
        f"{setup.threads} torch threads; target {METRIC} >= {setup.target}, graded every "
        f"{setup.eval_every} steps on the held-out set; schedule {setup.max_steps} steps"
    )
    print(
        f"{'':24}{'steps':>7}{'train s':>9}{'CPU s':>8}{'tokens':>10}{'tokens/s':>10}"
        f"{'eval s':>8}  {METRIC} by step (last round)"
    )
    for side in sides:
        runs = [r[side] for r in rounds]
        done = [o for o in runs if o.reached_step is not None]
        curve = " ".join(f"{s}:{v:.2f}" for s, v in runs[-1].curve)
        if len(done) < len(runs):
            print(f"{LABELS[side]:24}  target missed in {len(runs) - len(done)} of {len(runs)}")
        if not done:
            continue
        print(
            f"{LABELS[side]:24}{median(done, lambda o: o.reached_step or 0):7.0f}"
            f"{median(done, lambda o: o.train_s):9.1f}{median(done, lambda o: o.train_cpu_s):8.1f}"
            f"{median(done, lambda o: o.tokens):10,.0f}"
            f"{median(done, lambda o: o.tokens / o.train_s):10,.0f}"
            f"{median(done, lambda o: o.eval_s):8.1f}  {curve}"
        )
    if "swarm" not in sides:
        return
    for peer in (s for s in sides if s.startswith("hf-")):
        paired = [r for r in rounds if all(r[s].reached_step is not None for s in ("swarm", peer))]
        if not paired:
            print(f"no round where Swarm and {LABELS[peer]} both reached the target: no ratio")
            continue
        ratios = {
            what: [getattr(r[peer], what) / getattr(r["swarm"], what) for r in paired]
            for what in ("train_s", "train_cpu_s", "tokens")
        }
        print(
            f"Swarm vs {LABELS[peer]} to the same {METRIC}: "
            f"{statistics.median(ratios['train_s']):.2f}x faster in wall time (rounds: "
            f"{', '.join(f'{x:.2f}' for x in ratios['train_s'])}), "
            f"{statistics.median(ratios['train_cpu_s']):.2f}x in CPU time; "
            f"HF needed {statistics.median(ratios['tokens']):.2f}x Swarm's tokens"
        )


def median(outcomes: list[Outcome], value: Callable[[Outcome], float]) -> float:
    return statistics.median(value(o) for o in outcomes)


if __name__ == "__main__":
    main()

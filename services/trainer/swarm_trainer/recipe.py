"""The per-worker LoRA fine-tuning loop that Ray Train runs on every rank.

Read top to bottom: setup (model, adapter, data, optimizer, schedule), resume from the last
committed checkpoint (weights, optimizer, schedule, RNG, data position), train with gradient
accumulation and clipping, evaluate and keep the best adapter, checkpoint through
``ray.train.report``, and at the end save the best adapter (rank 0) to the run's output prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft import set_peft_model_state_dict as set_adapter_weights
from ray.util.queue import Full
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm_common.jobs import LoraSpec, TrainingSpec
from swarm_common.settings import Settings
from swarm_common.store import ObjectStore, join_key, open_store
from swarm_common.workers import Assignment
from swarm_trainer.checkpoint import (
    ADAPTER_FILE,
    checkpoint_dir_name,
    load_best_adapter,
    load_checkpoint,
    run_key,
    save_adapter,
    save_checkpoint,
    wait_committed,
)
from swarm_trainer.data import (
    Batch,
    BatchSampler,
    eval_batches,
    read_jsonl,
    shard,
    split_holdout,
    tokenize,
)
from swarm_trainer.parent_adapter import fetch_parent, load_parent
from swarm_trainer.rng import load_rng, save_rng

RESULT_FILE = "result.json"


def output_prefix(job_id: str, attempt: int) -> str:
    return f"outputs/{job_id}/{attempt}"


# --- setup helpers ---------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_lambda(warmup_steps: int, max_steps: int, floor: float = 0.1) -> Any:
    """Linear warmup, then cosine decay to ``floor`` x the peak rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def build_model(
    model_dir: Path, lora: LoraSpec, training: TrainingSpec, parent_dir: Path | None = None
) -> PeftModel:
    """Base model (safetensors only) with a LoRA adapter on top: a fresh one, or the parent
    adapter in ``parent_dir`` when the job continues training (``from_adapter``)."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    if training.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA) and under DDP.
        base.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    if parent_dir is not None:
        return load_parent(base, parent_dir, lora.dropout)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, config)  # type: ignore[return-value]


def unwrap(model: torch.nn.Module) -> PeftModel:
    """The PEFT model under any DDP wrapper that ``prepare_model`` added."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    assert isinstance(inner, PeftModel)
    return inner


def adapter_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    """A detached copy of the LoRA weights (small: kept in memory as the best so far)."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def store_from(config: dict[str, Any]) -> ObjectStore:
    s = config["store"]
    return open_store(
        Settings(
            store_url=s["url"],
            s3_access_key=s.get("access_key"),
            s3_secret_key=s.get("secret_key"),
            s3_region=s.get("region"),
        )
    )


def use_bf16(precision: str, device: torch.device) -> bool:
    if device.type != "cuda" or precision == "fp32":
        return False
    return torch.cuda.is_bf16_supported()


def autocast(bf16: bool) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


class Reporter:
    """Rank 0's line to the agent. Other ranks hold a no-op one."""

    def __init__(self, queue: Any | None, control: Any | None, rank: int) -> None:
        self.queue = queue if rank == 0 else None
        self.control = control

    def send(self, kind: str, **fields: Any) -> None:
        if self.queue is None:
            return
        # Progress is advisory: dropping one when the queue is full never loses state.
        # ``at`` (wall clock here) lets the agent place the phases in the job's trace.
        message = {"kind": kind, "at": time.time(), **fields}
        with contextlib.suppress(Full):
            self.queue.put(message, block=kind != "progress", timeout=10)

    def cancelled(self, device: torch.device) -> bool:
        """Rank 0 reads the flag and every rank gets its answer, so all stop on one step."""
        flag = 0.0
        if self.queue is not None and self.control is not None:
            flag = float(ray.get(self.control.cancelled.remote()))
        return all_reduce_sum([flag], device)[0] > 0 if dist.is_initialized() else flag > 0


# --- one optimizer step (also what bench/train_throughput.py times) ---------------------------


@dataclass
class StepResult:
    loss: float  # mean over the step's micro-batches
    tokens: int  # real (non-pad) tokens this rank processed
    sources: list[int] = field(default_factory=list)  # which examples it trained on


def train_step(
    model: torch.nn.Module,
    batches: list[Batch],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float,
    device: torch.device,
    bf16: bool = False,
) -> StepResult:
    """Forward/backward every micro-batch, then clip, step and advance the schedule.

    The loss is the mean over every target token of the step, not a mean of micro-batch
    means: then accumulating k micro-batches is the same step as one batch k times larger,
    whatever the completions' lengths (chat and prompt/completion data vary a lot).
    """
    result = StepResult(loss=0.0, tokens=0)
    targets = sum(batch.targets for batch in batches)
    for micro, batch in enumerate(batches):
        inputs = {k: v.to(device) for k, v in batch.inputs.items()}
        # Gradients are only exchanged on the last micro-batch of a step.
        last = micro == len(batches) - 1
        sync = nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync, autocast(bf16):
            # No KV cache in training; with one, transformers ignores packed position_ids.
            # num_items_in_batch makes the model's loss sum(token losses) / targets of the step.
            loss = model(
                **inputs, use_cache=False, num_items_in_batch=torch.tensor(targets, device=device)
            ).loss
            loss.backward()
        result.loss += float(loss.detach())
        result.tokens += batch.tokens
        result.sources += batch.sources
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return result


@torch.no_grad()
def evaluate(
    model: PeftModel, batches: list[Batch], device: torch.device, bf16: bool
) -> tuple[float, float]:
    """(eval loss, perplexity) averaged over target tokens of every rank's shard."""
    model.eval()
    loss_sum, tokens = 0.0, 0.0
    for batch in batches:
        inputs = {k: v.to(device) for k, v in batch.inputs.items()}
        with autocast(bf16):
            out = model(**inputs, use_cache=False)
        # HF averages over shifted target tokens; weigh by their count to average over all.
        n = float((inputs["labels"][:, 1:] != -100).sum())
        loss_sum += float(out.loss) * n
        tokens += n
    model.train()
    loss_sum, tokens = all_reduce_sum([loss_sum, tokens], device)
    loss = loss_sum / max(tokens, 1.0)
    return loss, math.exp(min(loss, 50.0))


@contextlib.contextmanager
def checkpoint_dir(work: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        yield Path(tmp)


def crash_hook(
    hooks: dict[str, Any], step: int, rank: int, store: ObjectStore, job: Assignment
) -> None:
    """Test-only: kill this worker process once before ``crash_before_step``, leaving behind a
    partial checkpoint directory as a crash in the middle of an upload would."""
    marker = hooks.get("crash_marker")
    if rank != 0 or hooks.get("crash_before_step") != step + 1 or not marker:
        return
    if os.path.exists(marker):
        return  # the retried run must get past this point
    # Wait until the last checkpoint is committed, so the test knows which step is resumed.
    wait_committed(store, job.job_id, job.attempt, step - step % int(hooks["checkpoint_every"]))
    Path(marker).write_text(str(step))
    run = run_key(job.job_id, job.attempt)
    partial = join_key(run, checkpoint_dir_name(step), ADAPTER_FILE)
    store.put_bytes(partial, b"half-written")
    os._exit(1)


# --- the loop ------------------------------------------------------------------------------


def train_loop(config: dict[str, Any]) -> None:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    job = Assignment.model_validate(config["assignment"])
    spec, t = job.spec, job.spec.training
    hooks: dict[str, Any] = config.get("hooks") or {}  # test-only instrumentation
    reporter = Reporter(config.get("progress"), config.get("control"), rank)
    store = store_from(config)
    device = ray.train.torch.get_device()
    bf16 = use_bf16(t.precision, device)
    seed_everything(t.seed)

    work = Path(tempfile.mkdtemp(prefix=f"{job.job_id}-r{rank}-", dir=config.get("work_dir")))
    try:
        # Setup: base model and tokenizer from the store, LoRA adapter on top.
        model_dir = work / "model"
        store.download_dir(job.base_model.store_key, model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad_id = tokenizer.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        # Continuing training starts from the parent adapter's weights (a resumed attempt
        # then overwrites them with its checkpoint's, below).
        parent_dir = fetch_parent(store, job.parent, work / "parent") if job.parent else None
        # DDP (when world > 1) broadcasts rank 0's initial weights, so all ranks start equal.
        model = ray.train.torch.prepare_model(build_model(model_dir, spec.lora, t, parent_dir))
        peft_model = unwrap(model)

        # Data: held-out split before sharding, so every rank agrees on what is validation;
        # then each rank takes a disjoint share of the training examples.
        store.get_file(job.dataset.store_key, work / "train.jsonl")
        records = read_jsonl(work / "train.jsonl")
        if job.validation is not None:
            store.get_file(job.validation.store_key, work / "val.jsonl")
            val_records = read_jsonl(work / "val.jsonl")
        else:
            records, val_records = split_holdout(records, t.val_fraction, t.seed)
        mine = shard(range(len(records)), rank, world)
        train_examples = tokenize([records[i] for i in mine], tokenizer, t.seq_len, mine)
        val_examples = (
            tokenize(shard(val_records, rank, world), tokenizer, t.seq_len)
            if len(val_records) >= world
            else []
        )
        pack_to = t.seq_len if t.packing else None
        sampler = BatchSampler(train_examples, t.batch_size, pad_id, t.seed + rank, pack_to)
        val_batches = eval_batches(val_examples, t.batch_size, pad_id)
        has_eval = bool(all_reduce_sum([float(len(val_batches))], device)[0])

        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=t.lr, weight_decay=0.0
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(t.warmup_steps, t.max_steps)
        )

        # Resume from the latest *committed* checkpoint: this attempt's own (Ray hands out only
        # those) after a retry, else the one an earlier attempt committed (the run's copy of
        # it, see ``checkpoint.prepare_resume``). Weights, optimizer, schedule, this rank's RNG
        # streams and the data position, so the run continues as if it had never stopped.
        state: dict[str, Any] = {
            "step": 0,
            "data_index": 0,
            "eval_history": [],
            "train_loss": None,
            "best": None,
        }
        best_weights: dict[str, torch.Tensor] | None = None
        checkpoint = ray.train.get_checkpoint() or config.get("resume_from")
        if checkpoint is not None:
            with checkpoint.as_directory() as d:
                state = load_checkpoint(Path(d), peft_model, optimizer, scheduler)
                best_weights = load_best_adapter(Path(d))
                load_rng(Path(d), rank)
        start_step = int(state["step"])
        reporter.send("started", resumed_from_step=start_step)

        model.train()
        started = time.monotonic()
        step = start_step
        seen: list[int] = []
        while step < t.max_steps:
            crash_hook(hooks, step, rank, store, job)
            if reporter.cancelled(device):
                reporter.send("cancelled", step=step)
                return
            step_start = time.monotonic()
            first = int(state["data_index"])
            batches = [sampler.batch(first + micro) for micro in range(t.grad_accum)]
            lr = scheduler.get_last_lr()[0]
            out = train_step(model, batches, optimizer, scheduler, t.max_grad_norm, device, bf16)
            step += 1
            seen += out.sources
            state |= {"step": step, "data_index": first + t.grad_accum, "train_loss": out.loss}
            elapsed = time.monotonic() - step_start
            reporter.send(
                "progress",
                step=step,
                max_steps=t.max_steps,
                loss=out.loss,
                lr=lr,
                tokens_per_s=out.tokens * world / max(elapsed, 1e-9),
                elapsed_s=time.monotonic() - started,
                step_s=elapsed,
            )

            metrics: dict[str, Any] = {"step": step, "loss": out.loss}
            if has_eval and (step % t.eval_every == 0 or step == t.max_steps):
                eval_start = time.monotonic()
                eval_loss, ppl = evaluate(peft_model, val_batches, device, bf16)
                eval_s = time.monotonic() - eval_start
                entry = {"step": step, "eval_loss": eval_loss, "perplexity": ppl}
                state["eval_history"].append(entry)
                # The adapter a job registers is its best by eval loss, not its last.
                if state["best"] is None or eval_loss < state["best"]["eval_loss"]:
                    state["best"], best_weights = entry, adapter_weights(peft_model)
                metrics |= {"eval_loss": eval_loss, "perplexity": ppl}
                reporter.send(
                    "validated", step=step, eval_loss=eval_loss, perplexity=ppl, eval_s=eval_s
                )

            if step % t.checkpoint_every == 0 or step == t.max_steps:
                # Every rank calls report (it is a barrier) with its RNG state; rank 0 adds the
                # rest. Ray copies all ranks' files into one directory and commits it only
                # after every rank has reported.
                upload_start = time.monotonic()
                with checkpoint_dir(work) as tmp:
                    if rank == 0:
                        save_checkpoint(tmp, peft_model, optimizer, scheduler, state, best_weights)
                    save_rng(tmp, rank)
                    ray.train.report(
                        metrics,
                        checkpoint=ray.train.Checkpoint.from_directory(tmp),
                        checkpoint_dir_name=checkpoint_dir_name(step),
                    )
                reporter.send(
                    "checkpoint",
                    step=step,
                    dir_name=checkpoint_dir_name(step),
                    upload_s=time.monotonic() - upload_start,
                )

        final_digest = digest(adapter_weights(peft_model))
        if hooks.get("trace_dir"):
            trace = {"rank": rank, "sources": seen, "adapter_digest": final_digest}
            Path(hooks["trace_dir"], f"rank{rank}.json").write_text(json.dumps(trace))

        # The final adapter goes straight to the store from rank 0, which may be on another
        # node than the agent; the agent only reads the small result file.
        if rank == 0:
            save_start = time.monotonic()
            if best_weights is not None:
                set_adapter_weights(peft_model, best_weights)
            out_dir = work / "adapter"
            save_adapter(peft_model, out_dir)
            prefix = output_prefix(job.job_id, job.attempt)
            store.upload_dir(out_dir, join_key(prefix, "adapter"))
            result: dict[str, Any] = {
                "step": step,
                "train_loss": state["train_loss"],
                "eval_history": state["eval_history"],
                "best_step": state["best"]["step"] if state["best"] else None,
                "elapsed_s": time.monotonic() - started,
            }
            if state["best"]:
                # Metrics describe the adapter registered, i.e. the best one.
                result["eval_loss"] = state["best"]["eval_loss"]
                result["perplexity"] = state["best"]["perplexity"]
                result["last_eval_loss"] = state["eval_history"][-1]["eval_loss"]
            store.put_bytes(join_key(prefix, RESULT_FILE), json.dumps(result).encode())
            reporter.send("finished", save_s=time.monotonic() - save_start, **result)
    finally:
        shutil.rmtree(work, ignore_errors=True)

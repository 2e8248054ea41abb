"""One optimizer step and one evaluation pass: what the loop repeats, and what
bench/train_throughput.py times on its own."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from peft import PeftModel

from swarm_trainer.data import Batch
from swarm_trainer.methods.method import Evaluated, Method
from swarm_trainer.methods.sft import Sft

SFT = Sft()


def lr_lambda(warmup_steps: int, max_steps: int, floor: float = 0.1) -> Callable[[int], float]:
    """Linear warmup, then cosine decay to ``floor`` x the peak rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def autocast(bf16: bool) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()


def make_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over the trainable (LoRA) weights; on CUDA the fused kernel: one launch for every
    tensor, and no ``.item()`` per parameter (the for-each version reads each step count on
    the host)."""
    return torch.optim.AdamW(list(params), lr=lr, weight_decay=0.0, fused=device.type == "cuda")


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sums over every rank (the values as they are when there is one)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(value: float, device: torch.device) -> float:
    """The largest ``value`` of any rank."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


@dataclass
class StepResult:
    # Mean over the step's targets (all micro-batches; what the method averages over: SFT's
    # target tokens, DPO's pairs), still on the device: reading it (``loss``) waits for the
    # step to finish.
    device_loss: torch.Tensor
    tokens: int = 0  # real (non-pad) tokens this rank processed
    sources: list[int] = field(default_factory=list)  # which examples it trained on
    # The method's measures (``Method.loss``'s stats) summed over the micro-batches, on the
    # device, and what they are a mean over.
    stats: torch.Tensor | None = None
    total: int = 0

    @property
    def loss(self) -> float:
        return float(self.device_loss)


def train_step(
    model: torch.nn.Module,
    batches: list[Batch],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float,
    device: torch.device,
    bf16: bool = False,
    select_logits: bool = True,
    method: Method = SFT,
) -> StepResult:
    """Forward/backward every micro-batch, then clip, step and advance the schedule.

    The loss is the method's mean over the whole step (SFT: every target token of it), not a
    mean of micro-batch means: then accumulating k micro-batches is the same step as one
    batch k times larger, whatever the completions' lengths (chat and prompt/completion data
    vary a lot).

    Nothing here waits for a GPU: the micro-batches' losses add up on the device, the
    target count is the collator's, clipping and the fused optimizer stay on the device. So
    the host can prepare the next batch while the GPU works, before it reads ``loss``.
    """
    result = StepResult(device_loss=torch.zeros((), device=device))
    result.total = method.step_total(batches)
    for micro, batch in enumerate(batches):
        # Gradients are only exchanged on the last micro-batch of a step.
        last = micro == len(batches) - 1
        sync = nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync, autocast(bf16):
            loss, stats = method.loss(model, batch.to(device), result.total, select_logits)
            loss.backward()
        result.device_loss += loss.detach()
        result.stats = stats if result.stats is None else result.stats + stats
        result.tokens += batch.tokens
        result.sources += batch.sources
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return result


@torch.no_grad()
def evaluate(
    model: PeftModel,
    batches: list[Batch],
    device: torch.device,
    bf16: bool,
    forwards: int = 0,
    method: Method = SFT,
) -> Evaluated:
    """The method's figures (SFT: eval loss and perplexity, averaged over target tokens) over
    every rank's shard.

    At least ``forwards`` forward passes: a sharded model's forward is a collective, so a rank
    with fewer batches runs its first again, uncounted, until the others are done."""
    model.eval()
    # Every rank sums, whether it has batches or not: the all-reduce below takes all ranks.
    sums = torch.zeros(method.eval_sums, dtype=torch.float64, device=device)
    padding = batches[:1] * max(0, forwards - len(batches))
    for batch in padding:
        with autocast(bf16):
            method.eval_stats(model, batch.to(device))
    for batch in batches:
        with autocast(bf16):
            stats = method.eval_stats(model, batch.to(device))
        sums += stats
    model.train()
    return method.evaluated(all_reduce_sum(sums.tolist(), device))

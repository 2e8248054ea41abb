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
import torch.nn.functional as F
from peft import PeftModel

from swarm_trainer import last_layer
from swarm_trainer.data import Batch


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
    # Mean over every target token of the step (all micro-batches), still on the device:
    # reading it (``loss``) waits for the step to finish.
    device_loss: torch.Tensor
    tokens: int = 0  # real (non-pad) tokens this rank processed
    sources: list[int] = field(default_factory=list)  # which examples it trained on

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
) -> StepResult:
    """Forward/backward every micro-batch, then clip, step and advance the schedule.

    The loss is the mean over every target token of the step, not a mean of micro-batch
    means: then accumulating k micro-batches is the same step as one batch k times larger,
    whatever the completions' lengths (chat and prompt/completion data vary a lot).

    Nothing here waits for a GPU: the micro-batches' losses add up on the device, the
    target count is the collator's, clipping and the fused optimizer stay on the device. So
    the host can prepare the next batch while the GPU works, before it reads ``loss``.
    """
    result = StepResult(device_loss=torch.zeros((), device=device))
    targets = sum(batch.targets for batch in batches)
    for micro, batch in enumerate(batches):
        # Gradients are only exchanged on the last micro-batch of a step.
        last = micro == len(batches) - 1
        sync = nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync, autocast(bf16):
            loss = causal_lm_loss(model, batch.to(device), targets, select_logits)
            loss.backward()
        result.device_loss += loss.detach()
        result.tokens += batch.tokens
        result.sources += batch.sources
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return result


def causal_lm_loss(
    model: torch.nn.Module, batch: Batch, targets: int, select_logits: bool = True
) -> torch.Tensor:
    """Sum of the batch's token losses over ``targets`` (the step's target count).

    In a one-row batch (``predicting`` set) the output layer runs only at positions whose next
    token is a target: prompt tokens need no logits, and with a 128k vocabulary the logits are
    a fifth of a 1B model's FLOPs and most of its activation memory. ``select_logits`` False
    leaves that to the model (Liger's fused linear + cross-entropy never makes the logits).
    Where ``last_layer`` is installed the last decoder layer's MLP, too, runs only there.
    """
    inputs = batch.model_inputs()
    # No KV cache in training; with one, transformers ignores packed position_ids.
    if batch.predicting is None or not select_logits:
        # num_items_in_batch makes the model's loss sum(token losses) / targets of the step.
        loss: torch.Tensor = model(**inputs, use_cache=False, num_items_in_batch=targets).loss
        return loss
    labels = inputs.pop("labels")
    layer = last_layer.installed(model)
    if layer is None:
        logits = model(**inputs, use_cache=False, logits_to_keep=batch.predicting).logits
    else:
        # The last layer's output already holds only those positions, so every one is kept.
        with last_layer.keeping(layer, batch.predicting):
            logits = model(**inputs, use_cache=False, logits_to_keep=0).logits
    wanted = labels[0, batch.predicting + 1]
    return F.cross_entropy(logits[0].float(), wanted, reduction="sum") / targets


@torch.no_grad()
def evaluate(
    model: PeftModel, batches: list[Batch], device: torch.device, bf16: bool, forwards: int = 0
) -> tuple[float, float]:
    """(eval loss, perplexity) averaged over target tokens of every rank's shard.

    At least ``forwards`` forward passes: a sharded model's forward is a collective, so a rank
    with fewer batches runs its first again, uncounted, until the others are done."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    targets = 0
    padding = batches[:1] * max(0, forwards - len(batches))
    for batch in padding:
        with autocast(bf16):
            model(**batch.to(device).model_inputs(), use_cache=False)
    for batch in batches:
        with autocast(bf16):
            out = model(**batch.to(device).model_inputs(), use_cache=False)
        # HF averages over shifted target tokens; weigh by their count to average over all.
        total += out.loss.detach().double() * batch.targets
        targets += batch.targets
    model.train()
    loss_sum, tokens = all_reduce_sum([float(total), float(targets)], device)
    loss = loss_sum / max(tokens, 1.0)
    return loss, math.exp(min(loss, 50.0))

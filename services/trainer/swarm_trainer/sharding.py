"""How a job's model is spread over its Ray Train workers (``resources.strategy``).

``ddp``: every rank holds the whole model and DDP averages the LoRA gradients (Ray's
``prepare_model``). ``fsdp``: FSDP2 (``fully_shard``) splits every parameter, base and LoRA,
across the ranks: each decoder layer is all-gathered just before it runs and freed after, and
gradients are reduce-scattered, so a rank holds about 1/world of the model. That is what lets
a base model bigger than one GPU train.

Sharded parameters are DTensors; what leaves the ranks (checkpoints, the best adapter so far,
the registered adapter) is always the full, unsharded tensors in the layout the ``ddp`` path
writes, so a checkpoint or adapter does not say how it was trained. Gathering them is a
collective: every rank calls the methods below, in the same order.
"""

from __future__ import annotations

from typing import Any

import ray.train.torch
import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


class Replicated:
    """``ddp``: the whole model on every rank; its state is already full and local."""

    # Whether every rank must run the same forwards (a sharded forward is a collective).
    lockstep = False

    def wrap(self, model: PeftModel) -> torch.nn.Module:
        """What the step runs: DDP-wrapped when there are several ranks."""
        wrapped: torch.nn.Module = ray.train.torch.prepare_model(model)
        return wrapped

    def unwrap(self, model: torch.nn.Module) -> PeftModel:
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        inner = model.module if ddp else model
        assert isinstance(inner, PeftModel)
        return inner

    def lora_state(self, model: PeftModel) -> dict[str, torch.Tensor] | None:
        """The trainable weights under the model's own names, for ``save_pretrained``; None:
        it reads them itself."""
        return None

    def adapter_weights(self, model: PeftModel) -> dict[str, torch.Tensor]:
        """A detached copy of the LoRA weights in PEFT's adapter layout."""
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}

    def set_adapter_weights(self, model: PeftModel, weights: dict[str, torch.Tensor]) -> None:
        set_peft_model_state_dict(model, weights)

    def optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        optimizer.load_state_dict(state)


class Sharded(Replicated):
    """``fsdp``: FSDP2 over all ranks, one unit per decoder layer plus the rest at the root."""

    lockstep = True

    def wrap(self, model: PeftModel) -> torch.nn.Module:
        # Layer by layer: each is moved to the device and sharded before the next, so no rank
        # ever holds more than one full layer. Gradients are reduce-scattered (averaged) on
        # every micro-batch; accumulating them unsharded instead would hold full LoRA grads.
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model

    def unwrap(self, model: torch.nn.Module) -> PeftModel:
        # fully_shard wraps nothing: it swaps the module's class in place.
        assert isinstance(model, PeftModel)
        return model

    def lora_state(self, model: PeftModel) -> dict[str, torch.Tensor]:
        return {
            name: full(param).detach().cpu().clone()
            for name, param in model.named_parameters()
            if param.requires_grad
        }

    def adapter_weights(self, model: PeftModel) -> dict[str, torch.Tensor]:
        return get_peft_model_state_dict(model, state_dict=self.lora_state(model))

    def set_adapter_weights(self, model: PeftModel, weights: dict[str, torch.Tensor]) -> None:
        # PEFT's adapter keys are the parameter names without the adapter's name.
        adapter = f".{model.active_adapter}"
        with torch.no_grad():
            for name, param in model.named_parameters():
                if not param.requires_grad:
                    continue
                value = weights[name.replace(adapter, "")].to(param.dtype)
                if isinstance(param, DTensor):
                    # Every rank has the full tensor: each keeps its own shard, no traffic.
                    mesh, placements = param.device_mesh, param.placements
                    value = distribute_tensor(
                        value.to(param.device), mesh, placements, src_data_rank=None
                    )
                param.copy_(value)

    def optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Full (gathered) state keyed by parameter name, on rank 0 only (the one that
        writes it; the others get an empty dict)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dict(get_optimizer_state_dict(model, optimizer, options=options))

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)


Sharding = Replicated
REPLICATED = Replicated()
SHARDED = Sharded()


def for_strategy(strategy: str) -> Replicated:
    return SHARDED if strategy == "fsdp" else REPLICATED


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def decoder_layers(model: PeftModel) -> list[torch.nn.Module]:
    """The base model's transformer blocks (what transformers calls ``_no_split_modules``)."""
    names = set(getattr(model.get_base_model(), "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError("fsdp: the base model names no decoder layer class (_no_split_modules)")
    return layers


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)

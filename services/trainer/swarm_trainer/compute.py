"""How a rank computes: precision, attention implementation and fused kernels, chosen per
device from the job's spec.

On a GPU the frozen base is loaded in bf16 and runs under bf16 autocast; the LoRA weights
stay fp32 (peft's ``autocast_adapter_dtype``: the optimizer updates fp32 master weights) and
their matmuls run in bf16 like the base's, with peft's cast of every LoRA input to fp32
turned off (``model.compute_lora_in_autocast``). On CPU everything is fp32.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from swarm_contracts.jobs import TrainingSpec
from swarm_trainer.attention import choose_attention


class KernelsUnavailable(RuntimeError):
    """The job asked for fused kernels this worker cannot run."""


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


@dataclass(frozen=True)
class Compute:
    device: torch.device
    bf16: bool  # base weights in bf16 and bf16 autocast (else fp32 throughout)
    attention: str  # transformers' attn_implementation
    liger: bool  # Liger Kernel's fused RMSNorm, RoPE, SwiGLU, linear + cross-entropy

    @property
    def dtype(self) -> torch.dtype:
        """The frozen base model's weights."""
        return torch.bfloat16 if self.bf16 else torch.float32

    def packed_row(self, seq_len: int, batch_size: int) -> int:
        """How long a packed row may be. Attention that keeps examples apart without a mask
        takes a micro-batch as one row: no row ends in padding, and the loss needs logits only
        where a target follows. The dense fallback's mask grows with the square of a row, so
        it keeps rows of ``seq_len``."""
        return seq_len if self.attention == "sdpa" else seq_len * batch_size


def use_bf16(precision: str, device: torch.device) -> bool:
    if device.type != "cuda" or precision == "fp32":
        return False
    return torch.cuda.is_bf16_supported()


def choose_compute(training: TrainingSpec, device: torch.device) -> Compute:
    bf16 = use_bf16(training.precision, device)
    dtype = torch.bfloat16 if bf16 else torch.float32
    cuda = device.type == "cuda"
    if training.liger == "on" and not (cuda and liger_installed()):
        raise KernelsUnavailable(
            "training.liger: on needs CUDA and the liger_kernel package on the worker"
        )
    liger = training.liger == "on" or (training.liger == "auto" and cuda and liger_installed())
    return Compute(device, bf16, choose_attention(training.attention, device, dtype), liger)

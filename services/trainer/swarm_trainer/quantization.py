"""QLoRA: the base model's decoder weights in 4-bit NF4 (bitsandbytes), compute in bf16.

Only the base model is quantized. The LoRA weights stay ordinary fp32 tensors with the same
names as over an unquantized base, so the adapter a QLoRA job registers is a plain PEFT
adapter: stock peft loads it on the unquantized model (for serving, merging, or continuing
training without quantization).

bitsandbytes is an optional extra of the trainer (``pip install swarm-trainer[qlora]``) and
its 4-bit kernels need CUDA: a worker without either fails the job with ``QuantizationUnavailable``
saying which is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from peft import prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, PreTrainedModel


class QuantizationUnavailable(RuntimeError):
    """``lora.quantize`` asked for what this worker cannot do."""


def nf4_unavailable(device: torch.device | None) -> str | None:
    """Why this process cannot load a model in NF4 on ``device``; None when it can."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return "lora.quantize nf4 needs a CUDA GPU (bitsandbytes' 4-bit kernels run on CUDA)"
    if importlib.util.find_spec("bitsandbytes") is None:
        return (
            "lora.quantize nf4 needs bitsandbytes on the worker "
            "(pip install 'swarm-trainer[qlora]')"
        )
    return None


def nf4_config() -> BitsAndBytesConfig:
    """QLoRA's recipe: NF4 weights, their block scales quantized again (double quantization,
    about 0.4 bit a weight less), matmuls in bf16."""
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_nf4(model_dir: Path, device: torch.device | None, **kwargs: Any) -> PreTrainedModel:
    """The base model, 4-bit on ``device``, ready for k-bit training (norms and embeddings in
    fp32, every base weight frozen). Gradient checkpointing is left to the caller, which
    enables it the same way for every base model."""
    reason = nf4_unavailable(device)
    if reason is not None:
        raise QuantizationUnavailable(reason)
    assert device is not None
    base = AutoModelForCausalLM.from_pretrained(
        model_dir,
        use_safetensors=True,
        quantization_config=nf4_config(),
        dtype=torch.bfloat16,
        # bitsandbytes quantizes while loading, onto this rank's GPU.
        device_map={"": device.index if device.index is not None else torch.cuda.current_device()},
        **kwargs,
    )
    prepared: PreTrainedModel = prepare_model_for_kbit_training(
        base, use_gradient_checkpointing=False
    )
    return prepared

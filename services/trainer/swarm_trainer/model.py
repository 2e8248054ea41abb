"""The model a job trains: the base model from a local directory with a LoRA adapter on top."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import AutoModelForCausalLM, PreTrainedModel

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer import attention, last_layer
from swarm_trainer.compute import Compute, choose_compute
from swarm_trainer.fused_lora import use_addmm_lora
from swarm_trainer.parent_adapter import load_parent
from swarm_trainer.quantization import load_nf4

# Non-reentrant checkpointing back-propagates into the LoRA weights of a checkpointed layer
# even though the layer's input (from frozen embeddings) needs no gradient, and it works
# under DDP; reentrant checkpointing would need ``enable_input_require_grads`` for that.
CHECKPOINTING_KWARGS = {"use_reentrant": False}


def build_model(
    model_dir: Path,
    lora: LoraSpec,
    training: TrainingSpec,
    parent_dir: Path | None = None,
    compute: Compute | None = None,
    device: torch.device | None = None,
) -> PeftModel:
    """Base model (safetensors only) with a LoRA adapter on top: a fresh one, or the parent
    adapter in ``parent_dir`` when the job continues training (``from_adapter``).

    ``compute`` (default: what the spec gives on CPU) sets the base's dtype, the attention
    implementation and the fused kernels. With ``lora.quantize`` the base is loaded 4-bit onto
    ``device`` (see ``quantization``)."""
    compute = compute or choose_compute(training, torch.device("cpu"))
    attention.register()
    if lora.quantize == "nf4":
        base = load_nf4(model_dir, device, attn_implementation=compute.attention)
    else:
        base = AutoModelForCausalLM.from_pretrained(
            model_dir,
            use_safetensors=True,
            dtype=compute.dtype,
            attn_implementation=compute.attention,
        )
    if compute.liger:
        # Imported only here: liger_kernel is optional (CUDA, Triton).
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(base, {})
    if training.gradient_checkpointing:
        enable_gradient_checkpointing(base)
    if parent_dir is not None:
        model = load_parent(base, parent_dir, lora.dropout)
    else:
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        # autocast_adapter_dtype (peft's default): fp32 LoRA weights on a bf16 base.
        model = get_peft_model(base, config)
    if compute.bf16:
        compute_lora_in_autocast(model)
    use_addmm_lora(model)
    if not training.gradient_checkpointing:
        last_layer.install(model)
    return model


def compute_lora_in_autocast(model: PeftModel) -> None:
    """Let LoRA layers take their bf16 input as it is: peft would cast it to the fp32 weights'
    dtype, and autocast would cast it straight back to bf16 for the matmul (a copy of every
    LoRA input in each direction). Under bf16 autocast the fp32 master weights are cast
    instead (r x d, small). Every forward must then run under autocast, as the step's do."""
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Keep only each decoder layer's inputs in the forward pass; recompute the rest in the
    backward pass.

    transformers 5.23 renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` and kept the old name as an alias that warns (it goes
    in v6); earlier 5.x releases have only the old name. Both make the embeddings' output
    require grad themselves (``enable_input_require_grads``)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=CHECKPOINTING_KWARGS)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=CHECKPOINTING_KWARGS)

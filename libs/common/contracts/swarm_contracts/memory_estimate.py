"""``estimate_memory``: a job's peak memory per GPU (or per CPU worker), a pure function of
the base model's shape and the job spec (the terms and why they are what they are:
``swarm_contracts.memory``).
"""

from __future__ import annotations

from swarm_contracts.jobs import JobSpec
from swarm_contracts.memory import (
    DTYPE_BYTES,
    LORA_BYTES_PER_PARAM,
    NF4_BYTES_PER_PARAM,
    PROJECTIONS,
    RUNTIME_BYTES,
    MemoryEstimate,
    ModelShape,
)


def adapted_modules(spec: JobSpec) -> list[str]:
    targets = spec.lora.target_modules
    return list(PROJECTIONS) if targets == "all-linear" else list(targets)


def estimate_memory(shape: ModelShape, spec: JobSpec, base_model: str = "") -> MemoryEstimate:
    """The peak memory of one of ``spec``'s workers training on a model of ``shape``: per
    GPU, or, for a CPU-only job, the host memory of a worker."""
    t, lora = spec.training, spec.lora
    # A DPO example is two sequences (prompt + chosen, prompt + rejected), both trained on in
    # one micro-batch; its reference forward runs first, without grad, and keeps nothing.
    sequences = 2 if spec.method.type == "dpo" else 1
    tokens = t.batch_size * sequences * t.seq_len
    on_gpu = spec.resources.gpus_per_worker > 0
    # ``auto`` trains in bf16 on a GPU (every GPU the trainer targets supports it), in fp32
    # on a CPU (swarm_trainer.compute).
    act = 4 if t.precision == "fp32" or (t.precision == "auto" and not on_gpu) else 2
    modules = [shape.projection(m) for m in adapted_modules(spec)]
    h, layers = shape.hidden_size, shape.num_layers

    # weights
    if lora.quantize == "nf4":
        quantized = min(shape.decoder_linear_params, shape.parameter_count)
        weights = quantized * NF4_BYTES_PER_PARAM + (shape.parameter_count - quantized) * 4
    else:
        weights = shape.parameter_count * DTYPE_BYTES[shape.dtype]

    # adapter and optimizer state
    lora_params = layers * sum(lora.r * (fan_in + fan_out) for fan_in, fan_out in modules)
    lora_bytes = lora_params * LORA_BYTES_PER_PARAM
    if spec.resources.strategy == "fsdp" and lora.quantize is None:
        # Each GPU keeps 1/workers of every weight, plus what is gathered whole at a time: the
        # root unit (embeddings, output layer, norms) for the whole step, and two decoder
        # layers (the one running and the one prefetched).
        n = spec.resources.workers
        dtype = DTYPE_BYTES[shape.dtype]
        root = (shape.parameter_count - shape.decoder_linear_params) * dtype
        layer = shape.decoder_linear_params / layers * dtype
        weights = min(weights, weights / n + root + 2 * layer)
        lora_bytes //= n

    # activations, per layer and token
    base = 2 * h * 4 + act * (2 * shape.q_dim + 2 * shape.kv_dim + 3 * shape.intermediate_size)
    # Each LoRA matmul keeps its input in the compute dtype (no fp32 copy is made: the trainer
    # turns peft's cast off; autograd may share some with the base layer's, so this is an
    # upper bound) and its rank-r intermediate.
    adapter = sum(fan_in * act + lora.r * 4 for fan_in, _ in modules)
    if lora.dropout > 0:
        adapter += sum(fan_in for fan_in, _ in modules)  # the dropout mask, a byte an element
    per_layer = base + adapter
    # Shared by the layers: RoPE's cos and sin, and the int64 token ids and labels.
    per_token = 2 * shape.head_dim * act + 16
    if t.gradient_checkpointing:
        activations = tokens * (per_token + layers * h * act + per_layer)
    else:
        activations = tokens * (per_token + layers * per_layer)

    logits = tokens * shape.vocab_size * (act + 4 + 4)
    runtime = RUNTIME_BYTES if on_gpu else 0
    total = weights + lora_bytes + activations + logits + runtime
    return MemoryEstimate(
        base_model=base_model,
        device="gpu" if on_gpu else "cpu",
        tokens=tokens,
        weights_bytes=int(weights),
        lora_bytes=lora_bytes,
        lora_parameters=lora_params,
        activations_bytes=int(activations),
        logits_bytes=int(logits),
        runtime_bytes=runtime,
        total_bytes=int(total),
    )

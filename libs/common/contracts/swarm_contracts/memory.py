"""How much GPU memory a job needs: the base model's architecture numbers (``ModelShape``, kept
by the registry) and the estimate's terms (``MemoryEstimate``), which ``memory_estimate``
computes from them and the job spec.

The terms, per GPU (each Ray worker holds a whole replica under DDP):

- **weights**: every base parameter at the checkpoint's dtype (what ``from_pretrained`` loads);
  with ``lora.quantize: nf4`` the decoder's linear weights take 4 bits plus their (double
  quantized) block scales, and ``prepare_model_for_kbit_training`` upcasts everything else to fp32.
- **lora**: the adapter's parameters, gradients and AdamW's two moments, all fp32 (16 bytes a
  parameter; peft keeps adapter weights fp32 under a 16-bit base).
- **activations**: what autograd keeps for the backward pass at ``batch_size * seq_len``
  tokens (the most one micro-batch can hold, padded or packed). Per decoder layer and token:
  both RMSNorms keep their fp32 upcast input; attention keeps q, k, v and its output; the MLP
  keeps gate, up and their product; peft keeps each adapted module's input cast to fp32 (a
  copy per module) and the rank-``r`` output of ``lora_A``; LoRA dropout adds its mask (one
  byte an element, CUDA's fused dropout); RoPE's cos and sin are kept once. No LxL attention
  scores: sdpa, flex and flash attention do not keep them. With gradient checkpointing only
  each layer's input is kept, plus one layer's worth recomputed during the backward pass.
- **logits**: ``tokens * vocab`` logits in the compute dtype, their fp32 log-probabilities kept
  for the loss, and the fp32 gradient of the same size in the backward pass: with a 128k
  vocabulary this is what runs big micro-batches out of memory.
- **runtime**: the CUDA context, cuBLAS workspaces and the caching allocator's slack, a
  constant.

The coefficients were read off autograd's saved tensors for Llama-shaped models with the
trainer's own stack (transformers 5, peft, sdpa); ``tests/trainer/test_memory_estimate.py``
checks them against a real model. The estimate is meant as a floor for placement: it leans to
the high side (a job placed on a GPU too small fails after minutes of setup).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

GB = 1 << 30
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
# bitsandbytes NF4 with double quantization (the trainer's setting): 4 bits a weight, an 8-bit
# absmax per block of 64 weights, and an fp32 scale per 256 of those.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# fp32 parameter + fp32 gradient + AdamW's exp_avg and exp_avg_sq.
LORA_BYTES_PER_PARAM = 4 * 4
RUNTIME_BYTES = 1 * GB
# The decoder layer's linear modules (Llama/Mistral/Qwen names) and what ``all-linear`` adapts.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ModelShape(BaseModel):
    """A decoder-only transformer's architecture numbers, read from its ``config.json``."""

    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    parameter_count: int = Field(ge=0, description="from the safetensors headers")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        description="the weights' dtype as loaded (config.json's dtype, else the files')"
    )

    @classmethod
    def from_config(
        cls, config: dict[str, Any], parameter_count: int, file_dtype: str | None = None
    ) -> ModelShape | None:
        """The shape of a HF decoder config; None when it is not one (no hidden size, layer
        count, heads, MLP width or vocabulary)."""
        # Multimodal configs nest the language model's numbers.
        text = config.get("text_config")
        c = {**config, **text} if isinstance(text, dict) else config
        try:
            hidden = int(c["hidden_size"])
            heads = int(c["num_attention_heads"])
            numbers = {
                "hidden_size": hidden,
                "num_layers": int(c["num_hidden_layers"]),
                "num_heads": heads,
                "num_kv_heads": int(c.get("num_key_value_heads") or heads),
                "head_dim": int(c.get("head_dim") or hidden // heads),
                "intermediate_size": int(c["intermediate_size"]),
                "vocab_size": int(c["vocab_size"]),
            }
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
        dtype = c.get("dtype") or c.get("torch_dtype") or file_dtype or "float32"
        if dtype not in DTYPE_BYTES:
            dtype = "float32"
        try:
            return cls(**numbers, parameter_count=parameter_count, dtype=dtype)
        except ValueError:
            return None

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def projection(self, name: str) -> tuple[int, int]:
        """(in, out) features of a decoder linear module; an unknown name counts as a
        hidden → hidden projection."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }.get(name, (h, h))

    @property
    def decoder_linear_params(self) -> int:
        """Parameters of the decoder layers' linear modules: what NF4 quantizes."""
        per_layer = sum(a * b for a, b in map(self.projection, PROJECTIONS))
        return self.num_layers * per_layer


class MemoryEstimate(BaseModel):
    """A job's estimated peak memory, by term (bytes): per GPU for a GPU job, per worker
    (host memory) for a CPU-only one."""

    base_model: str = Field(description="name@version the estimate is for")
    device: Literal["gpu", "cpu"] = Field(
        default="gpu",
        description="where the job runs: gpu (memory per GPU) or cpu (host memory per worker, "
        "fp32, no CUDA runtime)",
    )
    tokens: int = Field(
        description="tokens per micro-batch: batch_size * seq_len (DPO: two sequences per "
        "example, 2 * batch_size * seq_len)"
    )
    weights_bytes: int
    lora_bytes: int = Field(description="adapter parameters, gradients and AdamW state (fp32)")
    lora_parameters: int
    activations_bytes: int
    logits_bytes: int
    runtime_bytes: int = Field(description="CUDA context, workspaces, allocator slack (0 on CPU)")
    total_bytes: int

    @property
    def total_gb(self) -> float:
        return self.total_bytes / GB

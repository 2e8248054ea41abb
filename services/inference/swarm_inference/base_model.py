"""Loading a base model and its tokenizer from a local directory, and rendering chats.

Weights load with ``use_safetensors=True`` only (a pickle checkpoint could run code), never
from a hub: the directory comes from the object store, verified against the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

# For tokenizers without a chat template: the trainer's own chat format (swarm_trainer.methods.sft
# encodes {"messages"} examples as "role: content\n" lines), ending with the assistant's
# header so that the model writes the answer.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(device: torch.device, name: str = "auto") -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # CPU matmuls in bf16 are slow on most CPUs, and less exact


def load_base_model(
    path: Path, device: torch.device, dtype: torch.dtype
) -> tuple[PreTrainedModel, Tokenizer]:
    path = Path(path)
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"{path} has no .safetensors weights (only safetensors are loaded)")
    model = AutoModelForCausalLM.from_pretrained(
        path, use_safetensors=True, dtype=dtype, local_files_only=True
    )
    model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def render_chat(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]]) -> str:
    """The prompt for a chat: the tokenizer's chat template, else ``FALLBACK_CHAT_TEMPLATE``."""
    template = tokenizer.chat_template or FALLBACK_CHAT_TEMPLATE
    rendered = tokenizer.apply_chat_template(
        list(messages), chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert isinstance(rendered, str)
    return rendered

"""Reading a PEFT LoRA adapter directory: digests checked, safetensors only, plain LoRA only.

The engine does not run peft's layers (see ``lora_slots``), so this module turns a PEFT
directory into what the batched kernel needs: per target module, ``A`` (``[r, in]``), ``B``
(``[out, r]``) and the scale peft would apply (``alpha / r``, or ``alpha / sqrt(r)`` with
rsLoRA). Anything peft can save that this arithmetic would not reproduce exactly (DoRA, LoRA
biases, modules_to_save, ...) is refused with the reason, rather than served wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# peft's saved keys: base_model.model.<module path>.lora_A.weight (adapter name stripped).
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# Options whose effect the plain x @ A^T @ B^T * scale arithmetic does not include.
_UNSUPPORTED_OPTIONS = {
    "use_dora": "DoRA",
    "lora_bias": "LoRA biases",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
    "modules_to_save": "modules_to_save",
    "target_parameters": "target_parameters",
    "layer_replication": "layer_replication",
    "trainable_token_indices": "trainable tokens",
    "use_qalora": "QALoRA",
    "alora_invocation_tokens": "aLoRA",
}


class AdapterError(Exception):
    """An adapter that cannot be served: its files, digests, options or shapes are wrong."""


@dataclass(frozen=True)
class AdapterSource:
    """Where an adapter's files are, and the sha256 each must have (the registry's record).

    ``key`` names the adapter in the engine's cache (e.g. ``support-bot@3``): two sources with
    the same key must hold the same files.
    """

    key: str
    path: Path
    sha256: Mapping[str, str] = field(hash=False, compare=False)


@dataclass(frozen=True)
class LoraModule:
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class AdapterWeights:
    key: str
    modules: dict[
        str, LoraModule
    ]  # module path in the base model, e.g. model.layers.0.self_attn.q_proj


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digests_of(path: Path) -> dict[str, str]:
    """sha256 of every file in a directory: for adapters made locally (tests, benchmarks)."""
    return {p.name: sha256_file(p) for p in sorted(Path(path).iterdir()) if p.is_file()}


def verified(source: AdapterSource, name: str) -> Path:
    path = source.path / name
    expected = source.sha256.get(name)
    if expected is None:
        raise AdapterError(f"{source.key}: {name} has no recorded sha256; refusing to load it")
    if not path.is_file():
        raise AdapterError(f"{source.key}: {name} is missing")
    actual = sha256_file(path)
    if actual != expected:
        raise AdapterError(
            f"{source.key}: {name} sha256 {actual[:12]}… does not match the recorded "
            f"{expected[:12]}…; refusing to load it"
        )
    return path


def _pattern_value(patterns: Mapping[str, float], module: str, default: float) -> float:
    # peft's rule (peft.utils.other.get_pattern_key): a pattern matches a module path suffix.
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return float(value)
    return default


def read_adapter(source: AdapterSource) -> AdapterWeights:
    """Verify ``source``'s files against their digests and read its LoRA weights (on CPU)."""
    config_path = verified(source, CONFIG_FILE)
    weights_path = verified(source, WEIGHTS_FILE)
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{source.key}: {CONFIG_FILE} is not JSON: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{source.key}: a {config.get('peft_type')} adapter, not LoRA")
    for option, what in _UNSUPPORTED_OPTIONS.items():
        if config.get(option):
            raise AdapterError(f"{source.key}: {what} are not supported by the batched engine")
    alpha = float(config.get("lora_alpha", 8))
    alpha_pattern: Mapping[str, float] = config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora"))

    try:
        tensors = load_file(str(weights_path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise AdapterError(f"{source.key}: {WEIGHTS_FILE} is not readable: {exc}") from exc
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _KEY.match(name)
        if match is None:
            raise AdapterError(f"{source.key}: unexpected tensor {name!r} in {WEIGHTS_FILE}")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    modules: dict[str, LoraModule] = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{source.key}: {module} has lora_A or lora_B missing")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{source.key}: {module} has A {tuple(a.shape)}, B {tuple(b.shape)}")
        rank = a.shape[0]
        module_alpha = _pattern_value(alpha_pattern, module, alpha)
        scale = module_alpha / math.sqrt(rank) if rslora else module_alpha / rank
        modules[module] = LoraModule(a=a, b=b, scale=scale)
    if not modules:
        raise AdapterError(f"{source.key}: {WEIGHTS_FILE} holds no LoRA weights")
    return AdapterWeights(key=source.key, modules=modules)

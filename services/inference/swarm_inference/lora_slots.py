"""Many LoRA adapters in one forward pass: per-row slot gather (as punica and S-LoRA do).

Every linear layer that some loaded adapter targets is replaced by a ``MultiLoraLinear``
holding, for each adapter slot, ``A^T`` (``[in, R]``) and ``B^T * scale`` (``[R, out]``),
zero-padded to the largest rank ``R`` seen. A forward gathers each row's slot and adds
``x @ A[slot] @ B[slot]`` to the base layer's output with two batched matmuls, so a batch
mixing 32 adapters costs two ``bmm`` per layer instead of peft's loop over adapters.

Slot 0 is all zeros: a row without an adapter gets exactly the base model's output
(``base(x) + 0``). Zero padding to ``R`` adds exact zeros, so an adapter's rank does not
change its result.
"""

from __future__ import annotations

import torch
from torch import nn

from swarm_inference.adapter_files import AdapterError, AdapterWeights

BASE_SLOT = 0


class RowSlots:
    """Each batch row's slot for the forward about to run (``None``: no row has an adapter)."""

    def __init__(self) -> None:
        self.index: torch.Tensor | None = None


class MultiLoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, rows: RowSlots, slots: int, rank: int) -> None:
        super().__init__()
        self.base = base
        self.rows = rows
        weight = base.weight
        self.register_buffer(
            "lora_a",
            torch.zeros(slots, base.in_features, rank, dtype=weight.dtype, device=weight.device),
            persistent=False,
        )
        self.register_buffer(
            "lora_b",
            torch.zeros(slots, rank, base.out_features, dtype=weight.dtype, device=weight.device),
            persistent=False,
        )

    lora_a: torch.Tensor
    lora_b: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.lora_a.shape[-1])

    def grow_rank(self, rank: int) -> None:
        if rank <= self.rank:
            return
        pad = rank - self.rank
        # Zero columns of A and zero rows of B add exact zeros: loaded slots keep their result.
        self.lora_a = nn.functional.pad(self.lora_a, (0, pad))
        self.lora_b = nn.functional.pad(self.lora_b, (0, 0, 0, pad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        index = self.rows.index
        if index is None:
            return out
        # x: [rows, tokens, in] -> [rows, tokens, R] -> [rows, tokens, out]
        shrunk = torch.bmm(x, self.lora_a[index])
        return out + torch.bmm(shrunk, self.lora_b[index])


class LoraSlots:
    """The slot tensors of one base model: ``slots`` adapter slots plus the zero slot 0."""

    def __init__(self, model: nn.Module, slots: int) -> None:
        if slots < 1:
            raise ValueError("at least one adapter slot is needed")
        self.model = model
        self.capacity = slots
        self.rows = RowSlots()
        self.layers: dict[str, MultiLoraLinear] = {}

    def _layer(self, path: str, key: str) -> MultiLoraLinear:
        layer = self.layers.get(path)
        if layer is not None:
            return layer
        try:
            module = self.model.get_submodule(path)
        except AttributeError as exc:
            raise AdapterError(f"{key}: the base model has no module {path}") from exc
        if type(module) is not nn.Linear:
            raise AdapterError(f"{key}: {path} is a {type(module).__name__}, not a Linear layer")
        layer = MultiLoraLinear(module, self.rows, self.capacity + 1, rank=1)
        parent_path, _, attr = path.rpartition(".")
        setattr(self.model.get_submodule(parent_path) if parent_path else self.model, attr, layer)
        self.layers[path] = layer
        return layer

    def check(self, weights: AdapterWeights) -> None:
        """Refuse an adapter whose shapes do not fit this base model, before touching a slot."""
        for path, module in weights.modules.items():
            try:
                target = (
                    self.layers[path].base
                    if path in self.layers
                    else self.model.get_submodule(path)
                )
            except AttributeError as exc:
                raise AdapterError(f"{weights.key}: the base model has no module {path}") from exc
            if not isinstance(target, nn.Linear):
                raise AdapterError(f"{weights.key}: {path} is not a Linear layer")
            if module.a.shape[1] != target.in_features or module.b.shape[0] != target.out_features:
                raise AdapterError(
                    f"{weights.key}: {path} expects [{target.in_features} -> "
                    f"{target.out_features}], the adapter has A {tuple(module.a.shape)}, "
                    f"B {tuple(module.b.shape)}: it was trained on another base model"
                )

    @torch.no_grad()
    def write(self, slot: int, weights: AdapterWeights) -> None:
        if not 1 <= slot <= self.capacity:
            raise ValueError(f"slot {slot} is outside 1..{self.capacity}")
        self.check(weights)
        for path, module in weights.modules.items():
            self._layer(path, weights.key).grow_rank(module.rank)
        for path, layer in self.layers.items():
            layer.lora_a[slot].zero_()
            layer.lora_b[slot].zero_()
            lora = weights.modules.get(path)
            if lora is None:
                continue
            r = lora.rank
            a = lora.a.to(device=layer.lora_a.device, dtype=torch.float32)
            b = lora.b.to(device=layer.lora_b.device, dtype=torch.float32)
            layer.lora_a[slot, :, :r] = a.t().to(layer.lora_a.dtype)
            layer.lora_b[slot, :r, :] = (b.t() * lora.scale).to(layer.lora_b.dtype)

    @torch.no_grad()
    def clear(self, slot: int) -> None:
        for layer in self.layers.values():
            layer.lora_a[slot].zero_()
            layer.lora_b[slot].zero_()

    def set_rows(self, slots: list[int], device: torch.device) -> None:
        """The slot of each row of the next forward."""
        if any(slots):
            self.rows.index = torch.tensor(slots, dtype=torch.long, device=device)
        else:
            self.rows.index = None

"""LoRA's update added inside one matmul: ``result + scaling * (x A^T) B^T`` as one ``addmm``.

peft computes vanilla LoRA as ``result + lora_B(lora_A(x)) * scaling``: a matmul, then a
multiply and an add, each a pass over the layer's whole output, and the multiply's backward
another. ``addmm`` accumulates into ``result`` with ``alpha=scaling`` in the GEMM itself, and
its backward scales only the small rank-``r`` side. The weights, their names and the saved
adapter are peft's own: this is installed as a LoRA *variant*, peft's extension point for
how a layer computes (DoRA is one), on the training model only.
"""

from __future__ import annotations

from typing import Any

import torch
from peft import PeftModel
from peft.tuners.lora.layer import Linear, LoraVariant


class AddmmLora(LoraVariant):
    @staticmethod
    def init(module: Any, adapter_name: str, **kwargs: Any) -> None:
        pass  # nothing of its own: the weights are vanilla LoRA's

    @staticmethod
    def merge_safe(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight + module.get_delta_weight(active_adapter)

    @staticmethod
    def merge_unsafe(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> None:
        orig_weight.data += module.get_delta_weight(active_adapter)

    @staticmethod
    def unmerge(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight - module.get_delta_weight(active_adapter)

    @staticmethod
    def forward(
        module: Any, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        # A is called as the module it is (its hooks run); B's weight goes into the addmm.
        h = module.lora_A[active_adapter](module.lora_dropout[active_adapter](x))
        b = module.lora_B[active_adapter].weight  # [out, r]
        out = torch.addmm(
            result.reshape(-1, result.shape[-1]),
            h.reshape(-1, h.shape[-1]),
            b.t(),
            alpha=module.scaling[active_adapter],
        )
        return out.view(result.shape)


def use_addmm_lora(model: PeftModel) -> int:
    """Compute every plain LoRA linear layer with ``AddmmLora``; the number of layers changed.

    Layers that already have a variant (DoRA, ...) or a LoRA bias keep peft's own path.
    """
    changed = 0
    for module in model.modules():
        if type(module) is not Linear:
            continue
        for name, lora_b in module.lora_B.items():
            if name in module.lora_variant or lora_b.bias is not None:
                continue
            module.lora_variant[name] = AddmmLora()
            changed += 1
    return changed

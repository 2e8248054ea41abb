"""The running batch's KV cache: rows of different lengths, left-padded, joined and dropped
between decode steps.

Row ``i``'s real tokens are the last columns of every layer's keys/values; ``mask`` marks them
(1) and the padding (0). Each row's next position id is its count of real tokens, so padding
never shifts a row's rotary positions, and a row's attention sees only its own tokens: a
row gets the same logits as it would alone (up to float rounding of a different batch shape).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer


def _other_layers(config: PretrainedConfig) -> set[str]:
    cache = DynamicCache(config=config)
    return {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}


def cache_splices(config: PretrainedConfig) -> bool:
    """Whether the model's cache layers are all plain growing ones, which can be padded and
    spliced like this (not sliding windows, not linear attention)."""
    return not _other_layers(config)


def check_cache_support(config: PretrainedConfig) -> None:
    """Refuse models whose caches cannot be spliced (``cache_splices``)."""
    kinds = _other_layers(config)
    if kinds:
        raise ValueError(
            f"the batching engine supports full-attention models only; this one has {kinds}"
        )


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise TypeError(f"expected filled DynamicLayers, got {type(layer).__name__}")
        layers.append(layer)
    return layers


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None
    assert layer.values is not None
    return layer.keys, layer.values


class KvBatch:
    def __init__(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        self.cache = cache
        self.mask = mask  # [rows, columns], long
        self.layers = _layers(cache)

    def _apply(self, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every layer's keys and values by ``change`` of them."""
        for layer in self.layers:
            keys, values = _kv(layer)
            layer.keys, layer.values = change(keys), change(values)

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @staticmethod
    def prefill_inputs(
        prompts: list[list[int]], pad_id: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` for a prefill."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids, mask, positions

    @classmethod
    def from_prefill(
        cls, cache: DynamicCache, mask: torch.Tensor, zero_padding: bool = True
    ) -> KvBatch:
        """``zero_padding``: padding columns hold whatever the pad token's forward left there;
        zero them so that no NaN or inf can leak through a masked (zero-weight) column later
        (only where every layer keeps every column: ``cache_splices``)."""
        batch = cls(cache, mask)
        if zero_padding:
            padding = ~mask.bool()[:, None, :, None]
            batch._apply(lambda t: t.masked_fill(padding, 0.0))
        return batch

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Extend the mask by one column for the token about to be fed; return (mask,
        position_ids) for that decode step."""
        positions = self.mask.sum(dim=1, keepdim=True)
        self.mask = functional.pad(self.mask, (0, 1), value=1)
        return self.mask, positions

    def _pad_left(self, width: int) -> None:
        if width <= 0:
            return
        self.mask = functional.pad(self.mask, (width, 0), value=0)
        self._apply(lambda t: functional.pad(t, (0, 0, width, 0)))

    def extend(self, other: KvBatch) -> None:
        """Append ``other``'s rows (below this batch's), padding the shorter one on the left."""
        width = max(self.columns, other.columns)
        self._pad_left(width - self.columns)
        other._pad_left(width - other.columns)
        self.mask = torch.cat([self.mask, other.mask])
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            (my_keys, my_values), (their_keys, their_values) = _kv(mine), _kv(theirs)
            mine.keys = torch.cat([my_keys, their_keys])
            mine.values = torch.cat([my_values, their_values])

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order), then drop columns that are padding in all."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask[index]
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.columns
        self.mask = self.mask[:, first:]
        self._apply(lambda t: t[index, :, first:])

"""Attention for packed rows without a dense L x L mask, chosen per device.

A packed row holds several examples, with ``position_ids`` restarting at 0 for each (see
``data.collate_packed``). What keeps one example from attending to another:

* ``flash_attention_2`` (CUDA, where the ``flash_attn`` package is installed): varlen
  kernels over the sequence boundaries the collator computed (``cu_seq_lens_q/k`` and
  ``max_length_q/k``, so no per-layer host sync to find them);
* ``flex_attention`` (CUDA without ``flash_attn``): transformers builds a block-sparse
  ``BlockMask`` from the positions, and the compiled kernel skips the blocks off the diagonal;
* ``sdpa_varlen`` (CPU, registered here): causal sdpa over each example's own span, so only the
  diagonal blocks are ever computed. PyTorch 2.13's ``flex_attention`` has no backward on CPU
  ("FlexAttention does not support backward on CPU"), so it cannot train there;
* ``sdpa``: the fallback, transformers' dense block-diagonal ``[rows, 1, L, L]`` mask.

Padded (not packed) batches carry an ``attention_mask``; ``sdpa_varlen`` hands those to
transformers' sdpa path with its usual padding mask.
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

SDPA_VARLEN = "sdpa_varlen"
Attention = Literal["auto", "flash_attention_2", "flex_attention", "sdpa_varlen", "sdpa"]


class AttentionUnavailable(RuntimeError):
    """The job asked for an attention implementation this worker cannot run."""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def choose_attention(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The implementation a rank uses: the job's choice if this device can run it, else (for
    ``auto``) the fastest one here that never builds a dense mask for packed rows."""
    cuda = device.type == "cuda"
    flash_ok = cuda and flash_attn_installed() and dtype in (torch.bfloat16, torch.float16)
    if requested == "auto":
        if cuda:
            return "flash_attention_2" if flash_ok else "flex_attention"
        return SDPA_VARLEN
    if requested == "flash_attention_2" and not flash_ok:
        raise AttentionUnavailable(
            "training.attention: flash_attention_2 needs CUDA, bf16/fp16 and the flash_attn "
            "package on the worker"
        )
    if requested == "flex_attention" and not cuda:
        raise AttentionUnavailable(
            "training.attention: flex_attention cannot train on CPU (PyTorch has no CPU "
            "backward for it); use auto or sdpa_varlen"
        )
    return requested


def segments(
    batch: int, length: int, position_ids: torch.Tensor | None, cu_seq_lens: torch.Tensor | None
) -> list[list[tuple[int, int]]]:
    """Each row's (start, end) spans of one example, from the collator's cumulative lengths
    over the flattened rows if given, else from where the positions restart."""
    rows: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    if cu_seq_lens is not None:
        bounds = cu_seq_lens.tolist()
        for start, end in itertools.pairwise(bounds):
            row, at = divmod(start, length)
            rows[row].append((at, at + end - start))
        return rows
    if position_ids is None:
        return [[(0, length)] for _ in range(batch)]
    positions = position_ids.expand(batch, -1)
    starts = positions[:, 1:] != positions[:, :-1] + 1
    for row in range(batch):
        cuts = [0, *(starts[row].nonzero().flatten() + 1).tolist(), length]
        rows[row] = list(itertools.pairwise(cuts))
    return rows


def sdpa_varlen_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal sdpa over each example's span of each row ([batch, heads, L, dim] in,
    [batch, L, heads, dim] out, as transformers' attention functions)."""
    batch, _, length, _ = query.shape
    # Padded rows, or decoding with a KV cache (task evals generate): plain sdpa does it.
    if attention_mask is not None or key.shape[2] != length:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    gqa = key.shape[1] != query.shape[1]
    spans = segments(batch, length, kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"))
    rows = []
    for row, row_spans in enumerate(spans):
        # Split, not sliced one by one: the backward of a split is one concatenation, where
        # each slice's would be a zero tensor the size of the whole row (a third of the
        # attention's time on CPU with many short examples). The spans tile the row.
        sizes = [b - a for a, b in row_spans]
        qs, ks, vs = (t[row : row + 1].split(sizes, dim=2) for t in (query, key, value))
        parts = [
            F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
            )
            for q, k, v in zip(qs, ks, vs, strict=True)
        ]
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


def sdpa_varlen_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """No mask for packed rows (the spans come from the positions); padded batches get
    transformers' sdpa padding mask."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make ``sdpa_varlen`` a name ``from_pretrained(attn_implementation=...)`` accepts."""
    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_forward)
    AttentionMaskInterface.register(SDPA_VARLEN, sdpa_varlen_mask)

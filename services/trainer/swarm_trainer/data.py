"""JSONL datasets to token batches: read, split, shard by rank, sample, pad or pack.

What a line holds and how it becomes tokens is the training method's (``methods``: SFT's
text, prompt/completion and chat lines, DPO's preference pairs); this module lays tokenized
sequences (``Example``) out in micro-batches.

A micro-batch is either padded (rows padded to the longest example of the batch) or packed
(the batch's examples laid end to end in as few rows as fit ``seq_len``, with ``position_ids``
restarting at 0 for each example, no ``attention_mask``, and each example's span as
``cu_seq_lens_q/k`` over the flattened rows: the attention implementation (``attention``)
keeps every example to itself, and the model must be called without a KV cache,
``use_cache=False``, or transformers ignores packed positions).

Everything is a pure function of the data and the seed, so that a resumed run sees exactly
the batches the first attempt would have seen.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

IGNORE_INDEX = -100


class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


class DatasetError(ValueError):
    """The dataset cannot be used; the message says why, for the job's ``failed`` event."""


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]
    # Index of the source record in the dataset (after the holdout split): lets a rank say
    # which examples it trained on, e.g. to show that data-parallel shards are disjoint.
    source: int = -1


@dataclass(frozen=True)
class Batch:
    """Model inputs plus what the loop reports about them (never passed to the model).

    Counted on the host when collated, so that reading them never waits for the device."""

    inputs: dict[str, torch.Tensor]
    tokens: int  # real (non-pad) tokens: what tokens/s counts
    sources: list[int]
    # Tokens the loss is taken on (the model predicts position i + 1 from i).
    targets: int = 0
    # Packed rows: the longest example, which varlen attention kernels take as a host int.
    max_length: int | None = None
    # One-row batches: the positions whose next token is a target, the only ones whose logits
    # the loss needs (``methods.sft.target_logits``).
    predicting: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device``; to a GPU from pinned memory without blocking the host,
        so the copy overlaps whatever the GPU is still doing."""
        if device.type == "cpu" or self.inputs["input_ids"].device.type != "cpu":
            return self

        def send(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(device, non_blocking=True)

        inputs = {k: send(v) for k, v in self.inputs.items()}
        predicting = None if self.predicting is None else send(self.predicting)
        return dataclasses.replace(self, inputs=inputs, predicting=predicting)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for the model's forward."""
        if self.max_length is None:
            return dict(self.inputs)
        return {**self.inputs, "max_length_q": self.max_length, "max_length_k": self.max_length}


def count_targets(labels: torch.Tensor) -> int:
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def parse_jsonl(lines: Iterable[str | bytes], where: str = "") -> list[dict[str, Any]]:
    """JSONL's records (blank lines skipped); ``DatasetError`` names a bad line, after
    ``where`` (e.g. ``"frame 3, "``)."""
    records: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}line {lineno}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise DatasetError(f"{where}line {lineno}: expected a JSON object")
        records.append(record)
    return records


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        records = parse_jsonl(f)
    if not records:
        raise DatasetError(f"{path.name}: no examples")
    return records


def split_holdout(
    records: Sequence[Any], val_fraction: float, seed: int
) -> tuple[list[Any], list[Any]]:
    """(train, validation): a seeded random ``val_fraction`` held out, at least one if > 0."""
    if val_fraction <= 0 or len(records) < 2:
        return list(records), []
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_val = min(len(records) - 1, max(1, round(len(records) * val_fraction)))
    val_idx = set(order[:n_val])
    train = [r for i, r in enumerate(records) if i not in val_idx]
    val = [r for i, r in enumerate(records) if i in val_idx]
    return train, val


def shard(items: Sequence[Any], rank: int, world_size: int) -> list[Any]:
    """This rank's disjoint share (every ``world_size``-th item from ``rank``)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of {world_size}")
    return list(items[rank::world_size])


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Right-pad to the longest example; padded positions are masked and never targets. One
    row per example, in order (``sources`` too)."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids)
        labels[row, :n] = torch.tensor(e.labels)
        attention_mask[row, :n] = 1
    inputs = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
    sources = [e.source for e in examples]
    return Batch(inputs, int(attention_mask.sum()), sources, count_targets(labels))


def pack_rows(examples: Sequence[Example], capacity: int) -> list[list[Example]]:
    """First-fit decreasing: few, nearly full rows; deterministic for a given batch."""
    rows: list[list[Example]] = []
    room: list[int] = []
    for e in sorted(examples, key=lambda e: len(e.input_ids), reverse=True):
        n = len(e.input_ids)
        row = next((i for i, free in enumerate(room) if free >= n), None)
        if row is None:
            rows.append([])
            room.append(capacity)
            row = len(rows) - 1
        rows[row].append(e)
        room[row] -= n
    return rows


def collate_packed(examples: Sequence[Example], pad_id: int, capacity: int) -> Batch:
    """Several examples per row, positions restarting per example, no attention mask.

    The tail padding of a row gets its own restarted positions, so it is one more segment
    that attends only to itself and is never a target. ``cu_seq_lens`` are the segments'
    bounds over the rows laid end to end (what varlen attention kernels take). ``sources``
    are in the order the examples are laid out, row by row, so the targets (row-major) are
    each example's in that order: a method that needs each target's sequence (DPO) can tell.
    """
    rows = pack_rows(examples, capacity)
    width = max(sum(len(e.input_ids) for e in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    bounds = [0]
    for r, row in enumerate(rows):
        at = 0
        for e in row:
            n = len(e.input_ids)
            input_ids[r, at : at + n] = torch.tensor(e.input_ids)
            labels[r, at : at + n] = torch.tensor(e.labels)
            # An example's first token is never a target: predicting it would mean predicting
            # across the boundary from the previous example's last token.
            labels[r, at] = IGNORE_INDEX
            position_ids[r, at : at + n] = torch.arange(n)
            at += n
            bounds.append(r * width + at)
        position_ids[r, at:] = torch.arange(width - at)
        if at < width:
            bounds.append((r + 1) * width)
    cu_seq_lens = torch.tensor(bounds, dtype=torch.int32)
    inputs = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
    }
    tokens = sum(len(e.input_ids) for e in examples)
    sources = [e.source for row in rows for e in row]
    longest = int(cu_seq_lens.diff().max())
    predicting = (labels[0, 1:] != IGNORE_INDEX).nonzero().flatten() if len(rows) == 1 else None
    return Batch(inputs, tokens, sources, count_targets(labels), longest, predicting)


def collate_rows(examples: Sequence[Example], pad_id: int, pack_to: int | None) -> Batch:
    """Packed into rows of ``pack_to`` tokens, or padded (``pack_to`` None)."""
    if pack_to is not None:
        return collate_packed(examples, pad_id, pack_to)
    return collate(examples, pad_id)


# How a method lays its examples out in a micro-batch: (examples, pad id, row capacity when
# packing) -> batch. SFT's is ``collate_rows``; DPO's puts each pair's two sequences in it.
Collate = Callable[[Sequence[Any], int, "int | None"], Batch]


class BatchSampler:
    """Micro-batch ``i`` of an endless, per-epoch reshuffled pass over one rank's examples.

    Random access by index (not an iterator) so that a resumed run at step ``s`` continues
    with exactly the batch the interrupted run would have used next. An example is whatever
    the method's ``collate`` takes (SFT: an ``Example``; DPO: a pair of them).
    """

    def __init__(
        self,
        examples: Sequence[Any],
        batch_size: int,
        pad_id: int,
        seed: int,
        pack_to: int | None = None,
        collate: Collate = collate_rows,
    ):
        if not examples:
            raise DatasetError("this worker's shard of the training set is empty")
        self.examples = list(examples)
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.seed = seed
        self.pack_to = pack_to  # row capacity when packing, None to pad
        self.collate = collate
        self.per_epoch = max(1, len(self.examples) // batch_size)
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # only the current epoch is ever needed again
        return self._orders[epoch]

    def batch(self, index: int) -> Batch:
        epoch, pos = divmod(index, self.per_epoch)
        order = self._order(epoch)
        # Shards smaller than a batch wrap around rather than giving a short batch.
        picks = [order[(pos * self.batch_size + k) % len(order)] for k in range(self.batch_size)]
        return self.collate([self.examples[i] for i in picks], self.pad_id, self.pack_to)


class BatchSource(Protocol):
    """Micro-batches by index: a ``BatchSampler``, or a streamed dataset
    (``stream.TrainStream``)."""

    def batch(self, index: int) -> Batch: ...


class StepBatches:
    """Each step's micro-batches on the device, the next step's prepared ahead: collated and
    on their way to the GPU while it still runs the step before."""

    def __init__(self, sampler: BatchSource, per_step: int, device: torch.device):
        self.sampler = sampler
        self.per_step = per_step
        self.device = device
        self._ahead: tuple[int, list[Batch]] | None = None

    def take(self, index: int) -> list[Batch]:
        """The micro-batches from ``index`` on (prepared ahead if ``prefetch`` was told)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == index:
            return ahead[1]
        return self._load(index)

    def prefetch(self, index: int) -> None:
        self._ahead = (index, self._load(index))

    def _load(self, index: int) -> list[Batch]:
        return [self.sampler.batch(index + m).to(self.device) for m in range(self.per_step)]


def eval_batches(
    examples: Sequence[Any], batch_size: int, pad_id: int, collate: Collate = collate_rows
) -> list[Batch]:
    """Padded batches (evaluation runs the model as it is, with no packing)."""
    return [
        collate(examples[i : i + batch_size], pad_id, None)
        for i in range(0, len(examples), batch_size)
    ]

"""Supervised fine-tuning: next-token loss on what the model should learn to write.

Its line formats (one JSON object per line):

* ``{"text": ...}``: loss on every token;
* ``{"prompt": ..., "completion": ...}``: loss on the completion only;
* ``{"messages": [{"role": ..., "content": ...}, ...]}``: loss on assistant turns only,
  each message rendered as ``role: content`` and a newline (the trainer's chat format, which
  the inference worker uses for a tokenizer without a chat template).

An example is one sequence with its labels (``data.Example``, prompt positions ``-100``); the
loss is the mean over every target token of the step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from swarm_trainer import last_layer
from swarm_trainer.data import (
    IGNORE_INDEX,
    Batch,
    DatasetError,
    Example,
    Tokenizer,
    collate_rows,
)
from swarm_trainer.methods.method import Evaluated

# (text, trained-on): a piece of an example, in order.
Segment = tuple[str, bool]


def chat_segments(messages: Sequence[Any], where: str = "messages") -> list[Segment]:
    """Chat messages as pieces: the role header is context, never a target (the model should
    learn the answers); assistant contents are trained on."""
    pieces: list[Segment] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DatasetError(f"{where}[{i}] is not an object with 'role' and 'content'")
        role, content = str(message.get("role", "user")), str(message.get("content", ""))
        pieces.append((f"{role}: ", False))
        pieces.append((content + "\n", role == "assistant"))
    return pieces


def segments(record: dict[str, Any]) -> list[Segment]:
    """(text, trained-on) pieces of one example, in order."""
    if "prompt" in record and "completion" in record:
        return [(str(record["prompt"]), False), (str(record["completion"]), True)]
    if "text" in record:
        return [(str(record["text"]), True)]
    if "messages" in record and isinstance(record["messages"], list):
        return chat_segments(record["messages"])
    raise DatasetError(
        f"unsupported example with keys {sorted(record)}: "
        "expected text, prompt+completion, or messages"
    )


def encode_segments(
    pieces: Sequence[Segment], tokenizer: Tokenizer, seq_len: int, source: int = -1
) -> Example | None:
    """Tokens and labels (untrained positions = -100), with BOS and EOS, cut to ``seq_len``;
    None if nothing is left to learn from."""
    input_ids: list[int] = []
    labels: list[int] = []
    if tokenizer.bos_token_id is not None:
        input_ids.append(tokenizer.bos_token_id)
        labels.append(IGNORE_INDEX)
    for text, trained in pieces:
        ids = tokenizer.encode(text, add_special_tokens=False)
        input_ids.extend(ids)
        labels.extend(ids if trained else [IGNORE_INDEX] * len(ids))
    if tokenizer.eos_token_id is not None:
        input_ids.append(tokenizer.eos_token_id)
        # The end of a trained piece is itself a target: the model must learn to stop.
        labels.append(tokenizer.eos_token_id if labels[-1] != IGNORE_INDEX else IGNORE_INDEX)
    input_ids, labels = input_ids[:seq_len], labels[:seq_len]
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return Example(input_ids, labels, source)


def encode_example(
    record: dict[str, Any], tokenizer: Tokenizer, seq_len: int, source: int = -1
) -> Example | None:
    """Tokens and labels (prompt positions = -100); None if nothing is left to learn from."""
    return encode_segments(segments(record), tokenizer, seq_len, source)


def tokenize(
    records: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    seq_len: int,
    sources: Sequence[int] | None = None,
) -> list[Example]:
    ids = range(len(records)) if sources is None else sources
    examples = [
        e
        for r, i in zip(records, ids, strict=True)
        if (e := encode_example(r, tokenizer, seq_len, i)) is not None
    ]
    if not examples:
        raise DatasetError("no example has any target token left after truncation to seq_len")
    return examples


def target_logits(
    model: torch.nn.Module, batch: Batch, select_logits: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, target ids) at every target of the batch, row-major: ``[targets, vocab]`` and
    ``[targets]``.

    In a one-row batch (``predicting`` set) the output layer runs only at positions whose next
    token is a target: prompt tokens need no logits, and with a 128k vocabulary the logits are
    a fifth of a 1B model's FLOPs and most of its activation memory. Where ``last_layer`` is
    installed the last decoder layer's MLP, too, runs only there. ``select_logits`` False (or a
    padded batch) takes every position's logits and picks the targets'.
    """
    inputs = batch.model_inputs()
    labels = inputs.pop("labels")
    # No KV cache in training; with one, transformers ignores packed position_ids.
    if batch.predicting is None or not select_logits:
        logits = model(**inputs, use_cache=False).logits
        wanted = labels[:, 1:] != IGNORE_INDEX
        return logits[:, :-1][wanted], labels[:, 1:][wanted]
    layer = last_layer.installed(model)
    if layer is None:
        logits = model(**inputs, use_cache=False, logits_to_keep=batch.predicting).logits
    else:
        # The last layer's output already holds only those positions, so every one is kept.
        with last_layer.keeping(layer, batch.predicting):
            logits = model(**inputs, use_cache=False, logits_to_keep=0).logits
    return logits[0], labels[0, batch.predicting + 1]


def causal_lm_loss(
    model: torch.nn.Module, batch: Batch, targets: int, select_logits: bool = True
) -> torch.Tensor:
    """Sum of the batch's token losses over ``targets`` (the step's target count).

    A one-row batch takes logits at its targets only (``target_logits``); ``select_logits``
    False leaves the loss to the model (Liger's fused linear + cross-entropy never makes the
    logits)."""
    if batch.predicting is None or not select_logits:
        # num_items_in_batch makes the model's loss sum(token losses) / targets of the step.
        inputs = batch.model_inputs()
        loss: torch.Tensor = model(**inputs, use_cache=False, num_items_in_batch=targets).loss
        return loss
    logits, wanted = target_logits(model, batch)
    return F.cross_entropy(logits.float(), wanted, reduction="sum") / targets


class Sft:
    """The ``sft`` method (``swarm_contracts.methods.SftMethod``)."""

    name = "sft"
    eval_sums = 2  # loss x targets, targets
    sequences = 1  # per example
    encoding = "sft1"  # ``encode_example``'s tokens (see ``Method.encoding``)

    def encode(
        self,
        records: Sequence[dict[str, Any]],
        tokenizer: Tokenizer,
        seq_len: int,
        sources: Sequence[int] | None = None,
    ) -> list[Any]:
        return list(tokenize(records, tokenizer, seq_len, sources))

    def encode_record(
        self, record: dict[str, Any], tokenizer: Tokenizer, seq_len: int
    ) -> tuple[Example, ...] | None:
        example = encode_example(record, tokenizer, seq_len)
        return None if example is None else (example,)

    def example(self, sequences: Sequence[Example], source: int) -> Any:
        (example,) = sequences
        return dataclasses.replace(example, source=source)

    def collate(self, examples: Sequence[Any], pad_id: int, pack_to: int | None) -> Batch:
        return collate_rows(examples, pad_id, pack_to)

    def step_total(self, batches: Sequence[Batch]) -> int:
        return sum(batch.targets for batch in batches)

    def loss(
        self, model: torch.nn.Module, batch: Batch, total: int, select_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss = causal_lm_loss(model, batch, total, select_logits)
        return loss, loss.new_zeros(0)

    def step_metrics(self, stats: torch.Tensor, total: int) -> dict[str, float]:
        return {}

    def eval_stats(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        out = model(**batch.model_inputs(), use_cache=False)
        # HF averages over shifted target tokens; weigh by their count to average over all.
        loss = out.loss.detach().double()
        return torch.stack([loss * batch.targets, loss.new_tensor(float(batch.targets))])

    def evaluated(self, sums: Sequence[float]) -> Evaluated:
        loss_sum, tokens = sums
        loss = loss_sum / max(tokens, 1.0)
        return Evaluated(loss=loss, perplexity=math.exp(min(loss, 50.0)))

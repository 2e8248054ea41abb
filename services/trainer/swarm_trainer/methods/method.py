"""What a training method is to the recipe: its data format, its batch, its loss, its metrics.

The recipe and the step are the same for every method (``recipe``, ``step``); a method
(``methods.sft``, ``methods.dpo``) says how a dataset's records become examples, how examples
are laid out in a micro-batch, what the loss of a micro-batch is and what it measures. Its
measures are sums kept on the device as one vector (``stats``), so that the step adds the
micro-batches' up without waiting for the device and evaluation adds every rank's up with one
all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from swarm_trainer.data import Batch, Example, Tokenizer


@dataclass(frozen=True)
class Evaluated:
    """An evaluation's figures: the loss (what the best adapter is chosen by), a perplexity,
    and the method's own measures (DPO's rewards; none for SFT)."""

    loss: float
    perplexity: float
    metrics: dict[str, float] = field(default_factory=dict)


class Method(Protocol):
    name: str
    eval_sums: int  # how many sums ``eval_stats`` gives
    sequences: int  # sequences per example (a micro-batch of b examples holds b x this)
    # The token cache's name for what ``encode_record`` makes of a record: change it when that
    # changes, and runs stop reading the entries tokenized before.
    encoding: str

    def encode(
        self,
        records: Sequence[dict[str, Any]],
        tokenizer: Tokenizer,
        seq_len: int,
        sources: Sequence[int] | None = None,
    ) -> list[Any]:
        """The records as examples (each with its record's index, ``sources``), dropping those
        with nothing left to learn from after truncation to ``seq_len``; a ``DatasetError``
        when a record is not of the method's format or none is left."""
        ...

    def encode_record(
        self, record: dict[str, Any], tokenizer: Tokenizer, seq_len: int
    ) -> tuple[Example, ...] | None:
        """One record's ``sequences`` token sequences, as the token cache keeps them; None when
        it leaves nothing to learn from; a ``DatasetError`` when it is not the method's format."""
        ...

    def example(self, sequences: Sequence[Example], source: int) -> Any:
        """What ``collate`` takes, from one record's sequences (``encode_record``'s)."""
        ...

    def collate(self, examples: Sequence[Any], pad_id: int, pack_to: int | None) -> Batch:
        """A micro-batch of ``examples``: packed in rows of ``pack_to`` tokens, or padded."""
        ...

    def step_total(self, batches: Sequence[Batch]) -> int:
        """What a step's loss is a mean over (SFT: target tokens; DPO: pairs), so that k
        accumulated micro-batches make the same step as one k times larger."""
        ...

    def loss(
        self, model: torch.nn.Module, batch: Batch, total: int, select_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the micro-batch's share of the step's loss, to back-propagate; its ``stats``)."""
        ...

    def step_metrics(self, stats: torch.Tensor, total: int) -> dict[str, float]:
        """A step's measures from its micro-batches' summed ``stats`` (reads the device)."""
        ...

    def eval_stats(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """An evaluation batch's sums (float64, on the device), under ``torch.no_grad``."""
        ...

    def evaluated(self, sums: Sequence[float]) -> Evaluated:
        """The figures of an evaluation from its sums over every batch of every rank."""
        ...

"""Direct Preference Optimization (Rafailov et al., 2023): learn from pairs of answers, one
preferred, without a reward model.

Its line formats (one JSON object per line, one format per dataset):

* ``{"prompt": str, "chosen": str, "rejected": str}``;
* chat: ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`` (the
  answers are the assistant's turns);
* OpenAI's: ``{"input": {"messages": [...]}, "preferred_output": [messages],
  "non_preferred_output": [messages]}``.

A pair is two sequences, prompt + chosen and prompt + rejected, each tokenized as SFT
tokenizes a prompt/completion or chat example (``sft.encode_segments``: the same chat format,
BOS and EOS, cut to ``seq_len``). A sequence's log-probability is the sum over its answer's
tokens. A micro-batch holds both sequences of each of its pairs (packed in one row where the
attention allows, like SFT's), and each target token knows its sequence (``PairBatch``).
The token cache keeps a record's two sequences side by side (``encode_record``), so a DPO
training set streams from the store as SFT's does (``stream``).

The loss is DPO's sigmoid loss, averaged over the step's pairs::

    reward(y) = beta * (log pi(y | x) - log pi_ref(y | x))
    loss = -log sigmoid(reward(chosen) - reward(rejected))

The reference ``pi_ref`` is the same model with the adapter disabled (the base model), or
for a job continuing an adapter (``from_adapter``) that parent adapter's weights, run in eval
mode (no dropout) without gradients, before the policy's forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from peft import PeftModel

from swarm_trainer.data import IGNORE_INDEX, Batch, DatasetError, Example, Tokenizer, collate_rows
from swarm_trainer.methods.method import Evaluated
from swarm_trainer.methods.sft import Segment, chat_segments, encode_segments, target_logits

PREFERENCE_KEYS = (
    "expected {'prompt','chosen','rejected'} or OpenAI's "
    "{'input':{'messages'},'preferred_output','non_preferred_output'}"
)


@dataclass(frozen=True)
class Pair:
    chosen: Example
    rejected: Example
    source: int = -1  # the record's index, as ``Example.source``


@dataclass(frozen=True)
class PairBatch(Batch):
    """A micro-batch of pairs: sequence ``2k`` is pair k's chosen answer, ``2k + 1`` its
    rejected one; ``sequence`` gives each target token's sequence, in the order of the
    targets (row-major), so that the log-probabilities of a sequence's tokens can be summed."""

    sequence: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0))
    pairs: int = 0

    def to(self, device: torch.device) -> PairBatch:
        moved = super().to(device)
        if moved is self:
            return self
        assert isinstance(moved, PairBatch)
        sequence = self.sequence.pin_memory().to(device, non_blocking=True)
        return dataclasses.replace(moved, sequence=sequence)


def _prompt_segments(prompt: Any, where: str) -> list[Segment]:
    if isinstance(prompt, str):
        return [(prompt, False)]
    if isinstance(prompt, list):
        # The prompt is context only, assistant turns in it too.
        return [(text, False) for text, _ in chat_segments(prompt, where)]
    raise DatasetError(f"{where} must be a string or a list of messages")


def _answer_segments(answer: Any, where: str) -> list[Segment]:
    if isinstance(answer, str):
        return [(answer, True)]
    if isinstance(answer, list) and answer:
        return chat_segments(answer, where)
    raise DatasetError(f"{where} must be a string or a non-empty list of messages")


def pair_segments(record: dict[str, Any]) -> tuple[list[Segment], list[Segment], list[Segment]]:
    """(prompt, chosen answer, rejected answer) pieces of one preference record."""
    if "preferred_output" in record or "non_preferred_output" in record:
        source = record.get("input")
        messages = source.get("messages") if isinstance(source, dict) else None
        if not isinstance(messages, list):
            raise DatasetError("input.messages must be a list of messages")
        return (
            _prompt_segments(messages, "input.messages"),
            _answer_segments(record.get("preferred_output"), "preferred_output"),
            _answer_segments(record.get("non_preferred_output"), "non_preferred_output"),
        )
    if "chosen" in record and "rejected" in record:
        prompt = record.get("prompt", "")
        chat = isinstance(prompt, list)

        def answer(key: str) -> list[Segment]:
            value = record[key]
            if chat and isinstance(value, str):
                # A chat prompt's answer is the assistant's turn, as a chat is trained.
                value = [{"role": "assistant", "content": value}]
            return _answer_segments(value, key)

        return _prompt_segments(prompt, "prompt"), answer("chosen"), answer("rejected")
    raise DatasetError(f"unsupported example with keys {sorted(record)}: {PREFERENCE_KEYS}")


def encode_pair(
    record: dict[str, Any], tokenizer: Tokenizer, seq_len: int, source: int = -1
) -> Pair | None:
    """Both sequences of a record; None when either has no answer token left after the cut
    to ``seq_len`` (a pair is compared whole or not at all)."""
    prompt, chosen, rejected = pair_segments(record)
    a = encode_segments([*prompt, *chosen], tokenizer, seq_len, source)
    b = encode_segments([*prompt, *rejected], tokenizer, seq_len, source)
    if a is None or b is None:
        return None
    return Pair(a, b, source)


def targets_of(example: Example) -> int:
    """Its targets in a batch: every trained label but the first position's (which no token
    of the batch predicts)."""
    return sum(1 for label in example.labels[1:] if label != IGNORE_INDEX)


def collate_pairs(pairs: Sequence[Pair], pad_id: int, pack_to: int | None) -> PairBatch:
    """Both sequences of every pair, laid out as SFT's examples are (``data.collate_rows``),
    with each target's sequence."""
    sequences = [
        dataclasses.replace(e, source=2 * k + side)
        for k, pair in enumerate(pairs)
        for side, e in enumerate((pair.chosen, pair.rejected))
    ]
    batch = collate_rows(sequences, pad_id, pack_to)
    # The collators give the sequences' order in the batch; their targets follow it.
    order = torch.tensor(batch.sources, dtype=torch.long)
    counts = torch.tensor([targets_of(sequences[s]) for s in batch.sources], dtype=torch.long)
    return PairBatch(
        inputs=batch.inputs,
        tokens=batch.tokens,
        sources=[pair.source for pair in pairs],
        targets=batch.targets,
        max_length=batch.max_length,
        predicting=batch.predicting,
        sequence=torch.repeat_interleave(order, counts),
        pairs=len(pairs),
    )


def sequence_logps(
    model: torch.nn.Module, batch: PairBatch, select_logits: bool = True
) -> torch.Tensor:
    """Each sequence's log-probability of its answer: ``[2 * pairs]``, chosen at even
    indices, rejected at odd ones."""
    logits, wanted = target_logits(model, batch, select_logits)
    token_logps = -F.cross_entropy(logits.float(), wanted, reduction="none")
    out = token_logps.new_zeros(2 * batch.pairs)
    return out.index_add(0, batch.sequence, token_logps)


class Reference:
    """The frozen model DPO measures the policy against: the training model with its adapter
    disabled, or with the parent adapter's weights (``weights``, by parameter name) in place
    of the trained ones while it runs."""

    def __init__(self, model: PeftModel, weights: dict[str, torch.Tensor] | None = None):
        self.model = model
        self.weights = weights

    @classmethod
    def of(cls, model: PeftModel, parent: bool) -> Reference:
        """For a fresh adapter, the base model; for a parent adapter's, a copy of its weights
        as loaded (before any training or resume changes them)."""
        if not parent:
            return cls(model)
        weights = {
            name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad
        }
        return cls(model, weights)

    @contextlib.contextmanager
    def active(self) -> Iterator[PeftModel]:
        """The model as the reference, in eval mode (no dropout), within the block. Run it
        before the policy's forward: the parent's weights are copied in place, which a
        forward kept for the backward must not see."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.weights is None:
                with self.model.disable_adapter():
                    yield self.model
            else:
                with self._parent_weights():
                    yield self.model
        finally:
            self.model.train(was_training)

    @contextlib.contextmanager
    def _parent_weights(self) -> Iterator[None]:
        assert self.weights is not None
        params = {n: p for n, p in self.model.named_parameters() if n in self.weights}
        with torch.no_grad():
            trained = {n: p.detach().clone() for n, p in params.items()}
            for n, p in params.items():
                p.copy_(self.weights[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(trained[n])


def rewards(
    policy: torch.Tensor, reference: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rewards, rejected rewards), one per pair."""
    ratios = beta * (policy - reference)
    return ratios[0::2], ratios[1::2]


class Dpo:
    """The ``dpo`` method (``swarm_contracts.methods.DpoMethod``)."""

    name = "dpo"
    # loss sum, pairs, pairs ranked right, chosen and rejected reward sums, chosen answers'
    # negative log-likelihood sum and token count (their perplexity under the policy)
    eval_sums = 7
    sequences = 2  # per example: prompt + chosen, prompt + rejected
    encoding = "dpo1"  # ``encode_pair``'s tokens (see ``Method.encoding``)

    def __init__(self, beta: float, reference: Reference):
        self.beta = beta
        self.reference = reference

    def encode(
        self,
        records: Sequence[dict[str, Any]],
        tokenizer: Tokenizer,
        seq_len: int,
        sources: Sequence[int] | None = None,
    ) -> list[Any]:
        ids = range(len(records)) if sources is None else sources
        pairs = []
        for record, i in zip(records, ids, strict=True):
            try:
                pair = encode_pair(record, tokenizer, seq_len, i)
            except DatasetError as exc:
                raise DatasetError(f"example {i + 1}: {exc}") from exc
            if pair is not None:
                pairs.append(pair)
        if not pairs:
            raise DatasetError(
                "no preference pair has an answer token left in both sequences after "
                "truncation to seq_len"
            )
        return pairs

    def encode_record(
        self, record: dict[str, Any], tokenizer: Tokenizer, seq_len: int
    ) -> tuple[Example, ...] | None:
        pair = encode_pair(record, tokenizer, seq_len)
        return None if pair is None else (pair.chosen, pair.rejected)

    def example(self, sequences: Sequence[Example], source: int) -> Any:
        chosen, rejected = sequences
        return Pair(chosen, rejected, source)

    def collate(self, examples: Sequence[Any], pad_id: int, pack_to: int | None) -> Batch:
        return collate_pairs(examples, pad_id, pack_to)

    def step_total(self, batches: Sequence[Batch]) -> int:
        return sum(batch.pairs for batch in batches if isinstance(batch, PairBatch))

    def _logps(
        self, model: torch.nn.Module, batch: Batch, select_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the policy's sequence log-probs, with grad; the reference's, without)."""
        assert isinstance(batch, PairBatch)
        with torch.no_grad(), self.reference.active() as reference:
            ref = sequence_logps(reference, batch, select_logits)
        return sequence_logps(model, batch, select_logits), ref

    def loss(
        self, model: torch.nn.Module, batch: Batch, total: int, select_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        policy, ref = self._logps(model, batch, select_logits)
        chosen, rejected = rewards(policy, ref, self.beta)
        loss = -F.logsigmoid(chosen - rejected).sum() / max(total, 1)
        chosen, rejected = chosen.detach(), rejected.detach()
        stats = torch.stack([(chosen > rejected).sum().float(), chosen.sum(), rejected.sum()])
        return loss, stats

    def step_metrics(self, stats: torch.Tensor, total: int) -> dict[str, float]:
        correct, chosen, rejected = stats.tolist()
        return preference_metrics(total, correct, chosen, rejected)

    def eval_stats(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        assert isinstance(batch, PairBatch)
        policy, ref = self._logps(model, batch, select_logits=True)
        chosen, rejected = rewards(policy, ref, self.beta)
        # Rewards are relative to the reference; the chosen answers' likelihood is not.
        chosen_tokens = (batch.sequence % 2 == 0).sum()
        return torch.stack(
            [
                -F.logsigmoid(chosen - rejected).sum(),
                policy.new_tensor(float(batch.pairs)),
                (chosen > rejected).sum().float(),
                chosen.sum(),
                rejected.sum(),
                -policy[0::2].sum(),
                chosen_tokens.float(),
            ]
        ).double()

    def evaluated(self, sums: Sequence[float]) -> Evaluated:
        loss_sum, pairs, correct, chosen, rejected, nll, tokens = sums
        loss = loss_sum / max(pairs, 1.0)
        return Evaluated(
            loss=loss,
            perplexity=math.exp(min(nll / max(tokens, 1.0), 50.0)),
            metrics=preference_metrics(pairs, correct, chosen, rejected),
        )


def preference_metrics(
    pairs: float, correct: float, chosen: float, rejected: float
) -> dict[str, float]:
    """``swarm_contracts.methods.PreferenceMetrics``'s fields from sums over ``pairs``."""
    n = max(pairs, 1.0)
    return {
        "reward_accuracy": correct / n,
        "chosen_reward": chosen / n,
        "rejected_reward": rejected / n,
        "margin": (chosen - rejected) / n,
    }

"""One running batch of rows on one model: prefill, decode, each row's next token, its text.

The inference engine (``swarm_inference.engine``: requests from many callers, each with its own
adapter, joining and leaving between decode steps) and the trainer's task evals
(``swarm_trainer.task_eval``: the in-training PEFT model, greedy) both generate through
``RunningBatch``; ``generate`` is its whole loop for a list of prompts.

A turn: new rows are prefilled together (left-padded, ``kv_batch``) and spliced into the
running batch's KV cache, every row still going feeds its pending token through one decode
step, each row's next token is chosen with its own settings (``sampling``) and turned into text
(``text_stream``), and the rows that are done leave the batch. How the model is called is the
caller's (``forward``): the engine sets each row's LoRA slot around it.

A model whose cache cannot be spliced (sliding-window layers) is not served by the engine, but
``generate`` still runs it, as a static batch: no row joins or leaves until all are done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from swarm_generation.kv_batch import KvBatch, cache_splices
from swarm_generation.sampling import (
    Alternatives,
    SamplingParams,
    alternatives_generator,
    draw_alternatives,
    generator_for,
    next_tokens,
    target_logprobs,
)
from swarm_generation.text_stream import IncrementalDetokenizer, StopStrings

# (input_ids, attention_mask, position_ids, cache, rows, every_position) -> logits
Forward = Callable[..., torch.Tensor]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Prompt text to ids the way the trainer encodes examples: BOS (if the tokenizer has one
    and the text does not already start with it), then the text without specials."""
    ids: list[int] = tokenizer.encode(prompt, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def eos_ids(model: Any, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every end-of-sequence id the model's generation config, its config or the tokenizer
    names (Llama 3's instruct models end turns with one and texts with another)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def pad_id(model: Any, tokenizer: PreTrainedTokenizerBase) -> int:
    for value in (tokenizer.pad_token_id, getattr(model.config, "pad_token_id", None)):
        if isinstance(value, int):
            return value
    return next(iter(eos_ids(model, tokenizer)), 0)


@dataclass(eq=False, kw_only=True)
class Row:
    """One prompt being completed: its settings, and what it generated so far."""

    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    stops: StopStrings
    generator: torch.Generator | None
    generated: int = 0
    next_token: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # When asked (params.top_logprobs): each generated token's most likely alternatives.
    top_logprobs: list[Alternatives] = field(default_factory=list)
    # When asked: each prompt token's log-probability (the first has none: NaN).
    prompt_logprobs: list[float] | None = None
    # When asked (params.prompt_top_logprobs): each prompt position's most likely tokens
    # (the first has none: None).
    prompt_top_logprobs: list[Alternatives | None] | None = None
    # When asked (params.prompt_targets): the log-probabilities of those ids, row for row.
    prompt_target_logprobs: list[list[float]] | None = None
    # When asked (params.prompt_alt_tokens): each prompt position's draws after the first.
    prompt_alt_tokens: list[Alternatives] | None = None
    alt_generator: torch.Generator | None = None
    finish_reason: str | None = None  # "stop" or "length" once done
    done: bool = False
    aborted: bool = False  # nobody waits for it any more: it leaves at the next step

    @classmethod
    def new(
        cls, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], params: SamplingParams
    ) -> Row:
        return cls(**row_fields(tokenizer, prompt_ids, params))

    def accept(self, token: int, logprob: float | None, eos: Collection[int]) -> str:
        """Take the row's next token; the text it adds (``finish_reason`` set when it ends the
        row: an end-of-sequence or stop token, a stop string, ``max_tokens``)."""
        self.next_token = token
        self.generated += 1
        self.tokens.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
        stops: Collection[int] | None = self.params.stop_tokens
        if stops is None:
            stops = () if self.params.ignore_eos else eos
        if token in stops:
            text = self.stops.feed(self.detokenizer.flush()) + self.stops.finish()
            self.finish_reason = "stop"
        else:
            text = self.stops.feed(self.detokenizer.add(token))
            if self.stops.stopped:
                self.finish_reason = "stop"
            elif self.generated >= self.params.max_tokens:
                text += self.stops.feed(self.detokenizer.flush()) + self.stops.finish()
                self.finish_reason = "stop" if self.stops.stopped else "length"
        self.done = self.finish_reason is not None
        return text


def row_fields(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], params: SamplingParams
) -> dict[str, Any]:
    """A new row's fields (for subclasses of ``Row`` that add their own)."""
    return {
        "prompt_ids": list(prompt_ids),
        "params": params,
        "detokenizer": IncrementalDetokenizer(tokenizer, prompt_ids),
        "stops": StopStrings(params.stop),
        "generator": generator_for(params),
        "alt_generator": alternatives_generator(params),
    }


def model_logits(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: DynamicCache,
    every_position: bool = False,
) -> torch.Tensor:
    """The next token's logits of each row ([rows, vocab]); ``every_position``: of every
    position ([rows, positions, vocab])."""
    output = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=0 if every_position else 1,
    )
    logits: torch.Tensor = output.logits
    return logits if every_position else logits[:, -1, :]


R = TypeVar("R", bound=Row)


class RunningBatch(Generic[R]):
    """The rows being generated and their KV cache. Call with gradients off."""

    def __init__(
        self,
        model: Any,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        forward: Forward | None = None,
        allowed: Callable[[list[R]], list[list[int] | None] | None] | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.eos_ids = eos_ids(model, tokenizer)
        self.pad_id = pad_id(model, tokenizer)
        # Can rows join and leave a running batch (see the module's docstring)?
        self.splices = cache_splices(model.config)
        self.forward: Forward = forward or (
            lambda ids, mask, positions, cache, rows, every_position=False: model_logits(
                model, ids, mask, positions, cache, every_position
            )
        )
        # Each row's allowed next tokens (None: any), for constrained decoding.
        self.allowed = allowed or (lambda rows: None)
        self.rows: list[R] = []
        self.kv: KvBatch | None = None
        self.steps = 0  # decode steps
        self.generated_tokens = 0

    def prefill(self, admitted: list[R]) -> list[tuple[R, str]]:
        """Add ``admitted`` to the batch, each with its first token; (row, text) of each."""
        ids, mask, positions = KvBatch.prefill_inputs(
            [r.prompt_ids for r in admitted], self.pad_id, self.device
        )
        # Rows first: if the forward fails, whoever fails the batch finds these too.
        self.rows.extend(admitted)
        cache = DynamicCache(config=self.model.config)
        if any(scores_prompt(r.params) for r in admitted):
            every = self.forward(ids, mask, positions, cache, admitted, every_position=True)
            score_prompts(admitted, every)
            logits = every[:, -1, :]
        else:
            logits = self.forward(ids, mask, positions, cache, admitted)
        batch = KvBatch.from_prefill(cache, mask, zero_padding=self.splices)
        if self.kv is None:
            self.kv = batch
        else:
            self.kv.extend(batch)
        return self.choose(admitted, logits)

    def decode(self) -> list[tuple[R, str]]:
        """One decode step of every row (each feeds its pending token); (row, text) of each
        row still going."""
        if self.kv is None:
            return []
        mask, positions = self.kv.step_inputs()
        ids = torch.tensor([[r.next_token] for r in self.rows], device=self.device)
        logits = self.forward(ids, mask, positions, self.kv.cache, self.rows)
        self.steps += 1
        return self.choose(self.rows, logits)

    def choose(self, rows: list[R], logits: torch.Tensor) -> list[tuple[R, str]]:
        """Each row's next token from its logits; (row, new text) of the rows that took one."""
        allowed = self.allowed(rows)
        params = [r.params for r in rows]
        tokens, logprobs, tops = next_tokens(logits, params, [r.generator for r in rows], allowed)
        taken = []
        for row, token, logprob, top in zip(rows, tokens, logprobs, tops, strict=True):
            if row.done:  # a static batch's finished rows, or a failed constraint's
                continue
            if top is not None:
                row.top_logprobs.append(top)
            taken.append((row, row.accept(token, logprob, self.eos_ids)))
        self.generated_tokens += len(taken)
        return taken

    def retire(self) -> list[R]:
        """Drop the rows that are done or aborted; the dropped ones. A static batch drops its
        rows all at once, when none is left going."""
        gone = [r for r in self.rows if r.done or r.aborted]
        if not gone or (not self.splices and len(gone) < len(self.rows)):
            return []
        keep = [i for i, r in enumerate(self.rows) if not (r.done or r.aborted)]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.kv = None
        elif self.kv is not None:
            self.kv.keep(keep)
        return gone

    def clear(self) -> list[R]:
        """Drop every row (a failed forward); the dropped ones."""
        gone, self.rows, self.kv = self.rows, [], None
        return gone

    def room(self, max_batch_size: int) -> int:
        """How many rows may join now."""
        if not self.splices and self.rows:
            return 0
        return max(0, max_batch_size - len(self.rows))


def scores_prompt(params: SamplingParams) -> bool:
    """Does the row's prefill keep every position's logits (prompt log-probabilities)?"""
    return (
        params.prompt_logprobs
        or params.prompt_top_logprobs > 0
        or params.prompt_targets is not None
        or params.prompt_alt_tokens > 0
    )


def score_prompts(rows: Iterable[Row], logits: torch.Tensor) -> None:
    """Each asking row's prompt tokens' log-probabilities, and when asked the most likely
    tokens at each position, the log-probabilities of the ids it names and draws from each
    position's distribution, from a left-padded prefill's logits at every position (the logits
    at position ``p`` predict the token at ``p + 1``); on the device, one row at a time, each
    a few ops over all its positions."""
    width = logits.shape[1]
    for i, row in enumerate(rows):
        if not scores_prompt(row.params):
            continue
        n = len(row.prompt_ids)
        start = width - n  # the row's first prompt token, after its padding
        raw = logits[i, start : width - 1]
        predicted = raw.float().log_softmax(-1)
        targets = torch.tensor(row.prompt_ids[1:], device=logits.device)[:, None]
        scores = predicted.gather(1, targets)[:, 0].tolist()
        row.prompt_logprobs = [float("nan"), *scores]
        k = min(row.params.prompt_top_logprobs, predicted.shape[-1])
        if k > 0:
            values, ids = torch.topk(predicted, k, dim=-1)
            top: list[Alternatives | None] = [None]
            for row_ids, row_values in zip(ids.cpu().tolist(), values.cpu().tolist(), strict=True):
                top.append(list(zip(row_ids, row_values, strict=True)))
            row.prompt_top_logprobs = top
        if row.params.prompt_targets is not None:
            targets = torch.tensor(row.params.prompt_targets, device=logits.device)
            row.prompt_target_logprobs = target_logprobs(predicted, targets).tolist()
        k = row.params.prompt_alt_tokens
        if k > 0:
            drawn, drawn_logprobs = draw_alternatives(
                raw, predicted, k, row.params.temperature, row.alt_generator
            )
            row.prompt_alt_tokens = [
                list(zip(row_ids, row_values, strict=True))
                for row_ids, row_values in zip(
                    drawn.cpu().tolist(), drawn_logprobs.cpu().tolist(), strict=True
                )
            ]


@dataclass(frozen=True)
class Completion:
    text: str  # as streamed: stop strings cut, special tokens dropped
    tokens: tuple[int, ...]  # every generated id, the end-of-sequence one included
    finish_reason: str


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Iterable[list[int]],
    params: SamplingParams,
    device: torch.device,
    max_batch_size: int = 32,
) -> list[Completion]:
    """Complete every prompt (token ids), ``max_batch_size`` rows at a time; a row that ends
    makes room for the next prompt at once. The model as it is: call it in eval mode."""
    batch: RunningBatch[Row] = RunningBatch(model, tokenizer, device)
    rows = [Row.new(tokenizer, ids, params) for ids in prompts]
    texts: dict[Row, list[str]] = {row: [] for row in rows}
    waiting = deque(rows)
    while waiting or batch.rows:
        admitted = [waiting.popleft() for _ in range(min(len(waiting), batch.room(max_batch_size)))]
        if admitted:
            for row, text in batch.prefill(admitted):
                texts[row].append(text)
            batch.retire()  # rows done at their first token do not decode
        if batch.rows:
            for row, text in batch.decode():
                texts[row].append(text)
            batch.retire()
    return [
        Completion("".join(texts[row]), tuple(row.tokens), row.finish_reason or "length")
        for row in rows
    ]

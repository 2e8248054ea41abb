"""Continuous batching over one base model and many LoRA adapters.

One thread owns the model. Each turn of its loop it admits waiting requests (up to
``max_batch_size`` rows, each pinning its adapter's slot), prefills them together, splices
their KV caches into the running batch, runs one decode step for every row (each row with
its own adapter, see ``lora_slots``), samples each row's next token with the row's own
settings, streams the new text out and drops the rows that are done. A request therefore
joins the running batch between two decode steps, never waiting for the batch to finish.
When the engine is idle, the first request waits up to ``max_wait_s`` for company, so that
a burst is prefilled as one batch.

The batch itself (prefill, splicing, decode steps, token choice, detokenising) is
``swarm_generation.batch.RunningBatch``, which the trainer's task evals generate with too;
what is the engine's own is the thread, admission with adapter slots, constrained decoding
and delivering pieces to the asyncio side.

The asyncio side (``generate``) gets its pieces through ``loop.call_soon_threadsafe``;
leaving the iterator early cancels the request at the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from swarm_generation.batch import Row, RunningBatch, encode_prompt, model_logits, row_fields
from swarm_generation.kv_batch import check_cache_support
from swarm_generation.sampling import Alternatives, SamplingParams
from swarm_inference.adapter_cache import AdapterCache
from swarm_inference.adapter_files import AdapterError, AdapterSource
from swarm_inference.json_format import JsonConstraint, JsonFormatError, JsonVocabulary
from swarm_inference.lora_slots import BASE_SLOT, LoraSlots

log = logging.getLogger(__name__)


class EngineError(Exception):
    """A request the engine cannot run; ``code`` is OpenAI's error code for it."""

    code = "engine_error"


class InvalidRequest(EngineError):
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class AdapterUnavailable(EngineError):
    code = "adapter_unavailable"


class EngineStopped(EngineError):
    code = "engine_stopped"


def check_prompt(prompt_ids: list[int], params: SamplingParams, max_context: int | None) -> None:
    """Refuse what cannot be served: an empty prompt, or one that leaves no room for
    ``max_tokens`` in the model's context."""
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty")
    if max_context is not None and len(prompt_ids) + params.max_tokens > max_context:
        raise ContextLengthExceeded(
            f"this model's context is {max_context} tokens; the prompt has "
            f"{len(prompt_ids)} and max_tokens asks for {params.max_tokens} more"
        )


@dataclass(frozen=True)
class Piece:
    """New text of one request; the last piece has ``finish_reason`` ("stop" or "length")."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None
    # On the last piece: every generated token id, and their log-probabilities when asked.
    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    # When asked: each prompt token's log-probability after the ones before it (the first
    # token has none: NaN).
    prompt_logprobs: tuple[float, ...] | None = None
    # When asked: each generated token's most likely alternatives, (id, log-probability)
    # best first; and each prompt position's (the first has none: None).
    top_logprobs: list[Alternatives] | None = None
    prompt_top_logprobs: list[Alternatives | None] | None = None
    # When asked: the log-probabilities of the ids ``params.prompt_targets`` names, row for
    # row (0.0 where a cell names none); each prompt position's draws after the first.
    prompt_target_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[Alternatives] | None = None
    # Before the last piece, with logprobs: the tokens this piece's text comes from (those
    # since the last piece), their log-probabilities and alternatives, for a stream that
    # sends each token's with its text (the last piece's are the rest of the whole lists).
    step: Step | None = None


@dataclass(frozen=True)
class Step:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: list[Alternatives] | None


@dataclass(frozen=True)
class EngineStats:
    running: int
    queued: int
    adapters_loaded: list[str]
    free_slots: int
    adapter_slots: int
    steps: int
    generated_tokens: int
    mixed_forwards: int


_Sink = Callable[[list[tuple["_Sequence", Piece | BaseException]]], None]


@dataclass(eq=False, kw_only=True)
class _Sequence(Row):
    """A request's row: who waits for it, its adapter and its constraint."""

    adapter: AdapterSource | None
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Piece | BaseException]
    constraint: JsonConstraint | None = None
    id: int = 0
    slot: int = BASE_SLOT
    arrived: float = field(default_factory=time.monotonic)
    shown: int = 0  # tokens whose text went out in a piece

    def accept(self, token: int, logprob: float | None, eos: Collection[int]) -> str:
        if self.constraint is not None:
            self.constraint.advance(token)
        return super().accept(token, logprob, eos)

    def piece(self, text: str) -> Piece:
        if self.finish_reason is None:
            step = None
            if self.params.logprobs:
                new = slice(self.shown, self.generated)
                top = self.top_logprobs[new] if self.params.top_logprobs else None
                step = Step(tuple(self.tokens[new]), tuple(self.logprobs[new]), top)
                self.shown = self.generated
            return Piece(text, self.generated, len(self.prompt_ids), step=step)
        return Piece(
            text,
            self.generated,
            len(self.prompt_ids),
            finish_reason=self.finish_reason,
            tokens=tuple(self.tokens),
            logprobs=tuple(self.logprobs) if self.params.logprobs else None,
            prompt_logprobs=(
                tuple(self.prompt_logprobs)
                if self.prompt_logprobs is not None and self.params.prompt_logprobs
                else None
            ),
            top_logprobs=list(self.top_logprobs) if self.params.top_logprobs else None,
            prompt_top_logprobs=self.prompt_top_logprobs,
            prompt_target_logprobs=self.prompt_target_logprobs,
            prompt_alt_tokens=self.prompt_alt_tokens,
        )


class Engine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 16,
        max_wait_s: float = 0.01,
        adapter_slots: int = 8,
        max_context: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        check_cache_support(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None)
        self.lora = LoraSlots(model, adapter_slots)
        self.adapters = AdapterCache(self.lora)

        self._lock = threading.Condition()
        self._incoming: deque[_Sequence] = deque()
        self._queue: deque[_Sequence] = deque()  # engine thread only, from here down
        # Constrained rows whose constraint failed at the last token choice.
        self._refused: list[tuple[_Sequence, Piece | BaseException]] = []
        self._batch: RunningBatch[_Sequence] = RunningBatch(
            model, tokenizer, self.device, forward=self._forward, allowed=self._allowed
        )
        self.eos_ids = self._batch.eos_ids
        self.pad_id = self._batch.pad_id
        self.json_vocabulary = JsonVocabulary(tokenizer, self.eos_ids)
        self._ids = itertools.count(1)
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Forward passes whose rows used different adapters (or adapters and the base model).
        self.mixed_forwards = 0

    @property
    def steps(self) -> int:
        return self._batch.steps

    @property
    def generated_tokens(self) -> int:
        return self._batch.generated_tokens

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="swarm-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> EngineStats:
        with self._lock:
            queued = len(self._incoming) + len(self._queue)
        return EngineStats(
            running=len(self._batch.rows),
            queued=queued,
            adapters_loaded=self.adapters.loaded(),
            free_slots=self.adapters.free_slots(),
            adapter_slots=self.adapters.capacity,
            steps=self.steps,
            generated_tokens=self.generated_tokens,
            mixed_forwards=self.mixed_forwards,
        )

    # --- the asyncio side ------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        check_prompt(prompt_ids, params, self.max_context)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: AdapterSource | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> AsyncIterator[Piece]:
        """Stream the completion of ``prompt_ids``; raises ``EngineError`` subclasses. With
        ``json_schema`` the text is a JSON document that the schema accepts (cut short only
        by ``max_tokens`` or a stop string)."""
        self.check(prompt_ids, params)
        constraint = None
        if json_schema is not None:
            try:
                # Off the event loop: the first one walks the whole vocabulary.
                constraint = await asyncio.to_thread(self.json_vocabulary.constraint, json_schema)
            except JsonFormatError as exc:
                raise InvalidRequest(str(exc)) from exc
        seq = _Sequence(
            **row_fields(self.tokenizer, prompt_ids, params),
            adapter=adapter,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            constraint=constraint,
            id=next(self._ids),
        )
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine is stopping")
            self._incoming.append(seq)
            self._lock.notify_all()
        try:
            while True:
                item = await seq.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            seq.aborted = True  # read by the engine thread at its next step; no-op when done

    async def complete(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: AdapterSource | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Piece:
        """The whole completion as one piece."""
        parts: list[str] = []
        last: Piece | None = None
        async for piece in self.generate(prompt_ids, params, adapter, json_schema):
            parts.append(piece.text)
            last = piece
        assert last is not None
        return replace(last, text="".join(parts))

    # --- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        with torch.no_grad():
            while self._wait_for_work():
                try:
                    self._turn()
                except Exception as exc:  # a failed forward must not kill the engine
                    log.exception("decode step failed; failing the batch")
                    self._fail_all(EngineError(f"generation failed: {exc!r}"))
        self._fail_all(EngineStopped("the engine stopped"))

    def _wait_for_work(self) -> bool:
        """Move arrivals to the queue; block while idle; False when stopping."""
        with self._lock:
            if not self._batch.rows and not self._queue:
                self._lock.wait_for(lambda: self._incoming or self._stopping)
                if self._incoming and not self._stopping:
                    # Idle: give a burst up to max_wait_s to arrive, so it prefills as one batch.
                    deadline = self._incoming[0].arrived + self.max_wait_s
                    while len(self._incoming) < self.max_batch_size and not self._stopping:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._lock.wait(remaining)
            self._queue.extend(self._incoming)
            self._incoming.clear()
            return not self._stopping

    def _turn(self) -> None:
        admitted = self._admit()
        out: list[tuple[_Sequence, Piece | BaseException]] = []
        if admitted:
            self._pieces(self._batch.prefill(admitted), out)
            # Rows done at their first token do not decode; every row still going feeds its
            # pending token.
            self._retire()
        if self._batch.rows:
            self._pieces(self._batch.decode(), out)
        self._retire()
        self._send(out)

    def _admit(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        waiting: deque[_Sequence] = deque()
        failed: list[tuple[_Sequence, Piece | BaseException]] = []
        while self._queue:
            seq = self._queue.popleft()
            if seq.aborted:
                continue
            if len(self._batch.rows) + len(admitted) >= self.max_batch_size:
                waiting.append(seq)
                continue
            if seq.adapter is not None:
                try:
                    slot = self.adapters.acquire(seq.adapter)
                except AdapterError as exc:
                    failed.append((seq, AdapterUnavailable(str(exc))))
                    continue
                if slot is None:  # every slot is pinned by running rows: wait for one
                    waiting.append(seq)
                    continue
                seq.slot = slot
            admitted.append(seq)
        self._queue = waiting
        self._send(failed)
        return admitted

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        rows: list[_Sequence],
        every_position: bool = False,
    ) -> torch.Tensor:
        """The model's logits (``model_logits``) with each row's adapter."""
        slots = [s.slot for s in rows]
        self.lora.set_rows(slots, self.device)
        if len(set(slots)) > 1:
            self.mixed_forwards += 1
        try:
            return model_logits(self.model, ids, mask, positions, cache, every_position)
        finally:
            self.lora.rows.index = None

    def _pieces(
        self,
        taken: list[tuple[_Sequence, str]],
        out: list[tuple[_Sequence, Piece | BaseException]],
    ) -> None:
        """What the rows' new tokens send: the refused rows' errors, the new text, the last
        piece of each finished row."""
        out.extend(self._refused)
        self._refused = []
        out.extend((seq, seq.piece(text)) for seq, text in taken if text or seq.done)

    def _allowed(self, rows: list[_Sequence]) -> list[list[int] | None] | None:
        """Each row's allowed token ids (None: any). A row whose constraint fails ends with
        the error; the batch goes on."""
        if all(seq.constraint is None for seq in rows):
            return None
        allowed: list[list[int] | None] = []
        for seq in rows:
            ids = None
            if seq.constraint is not None and not seq.done:
                try:
                    ids = seq.constraint.allowed()
                except JsonFormatError as exc:
                    seq.done = True
                    self._refused.append((seq, InvalidRequest(str(exc))))
            allowed.append(ids)
        return allowed

    def _retire(self) -> None:
        """Drop rows that finished or whose caller went away; release their adapters."""
        for seq in self._batch.retire():
            if seq.adapter is not None:
                self.adapters.release(seq.adapter.key)

    def _send(self, out: list[tuple[_Sequence, Piece | BaseException]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Sequence, Piece | BaseException]]] = {}
        for seq, item in out:
            by_loop.setdefault(seq.loop, []).append((seq, item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                for seq, _ in items:
                    seq.aborted = True

    def _fail_all(self, error: EngineError) -> None:
        with self._lock:
            pending = list(self._incoming)
            self._incoming.clear()
        rows = self._batch.clear()
        victims = [*rows, *self._queue, *pending]
        for seq in rows:
            if seq.adapter is not None:
                self.adapters.release(seq.adapter.key)
        self._queue, self._refused = deque(), []
        self._send([(seq, error) for seq in victims if not seq.done])


def _deliver(items: list[tuple[_Sequence, Piece | BaseException]]) -> None:
    for seq, item in items:
        seq.queue.put_nowait(item)

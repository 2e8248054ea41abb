"""Continuous batching over one base model and many LoRA adapters.

One thread owns the model. Each turn of its loop it admits waiting requests (up to
``max_batch_size`` rows, each pinning its adapter's slot), prefills them together, splices
their KV caches into the running batch, runs one decode step for every row (each row with
its own adapter, see ``lora_slots``), samples each row's next token with the row's own
settings, streams the new text out and drops the rows that are done. A request therefore
joins the running batch between two decode steps, never waiting for the batch to finish.
When the engine is idle, the first request waits up to ``max_wait_s`` for company, so that
a burst is prefilled as one batch.

The asyncio side (``generate``) gets its pieces through ``loop.call_soon_threadsafe``;
leaving the iterator early cancels the request at the next step.

Long because: admission, prefill, splicing, decoding and release all act on the one batch the
model's thread owns, and are read together.
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

from swarm_inference.adapter_cache import AdapterCache
from swarm_inference.adapter_files import AdapterError, AdapterSource
from swarm_inference.json_format import JsonConstraint, JsonFormatError, JsonVocabulary
from swarm_inference.kv_batch import KvBatch, check_cache_support
from swarm_inference.lora_slots import BASE_SLOT, LoraSlots
from swarm_inference.sampling import SamplingParams, generator_for, next_tokens
from swarm_inference.text_stream import IncrementalDetokenizer, StopStrings

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


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Prompt text to ids the way the trainer encodes examples: BOS (if the tokenizer has one
    and the text does not already start with it), then the text without specials."""
    ids: list[int] = tokenizer.encode(prompt, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


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


@dataclass(eq=False)
class _Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    adapter: AdapterSource | None
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Piece | BaseException]
    detokenizer: IncrementalDetokenizer
    stops: StopStrings
    generator: torch.Generator | None
    constraint: JsonConstraint | None = None
    id: int = 0
    slot: int = BASE_SLOT
    generated: int = 0
    next_token: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_logprobs: list[float] | None = None
    aborted: bool = False
    done: bool = False
    arrived: float = field(default_factory=time.monotonic)


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
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = _pad_id(model, tokenizer)
        self.json_vocabulary = JsonVocabulary(tokenizer, self.eos_ids)

        self._lock = threading.Condition()
        self._incoming: deque[_Sequence] = deque()
        self._queue: deque[_Sequence] = deque()  # engine thread only, from here down
        self._rows: list[_Sequence] = []
        self._kv: KvBatch | None = None
        self._ids = itertools.count(1)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.generated_tokens = 0
        # Forward passes whose rows used different adapters (or adapters and the base model).
        self.mixed_forwards = 0

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
            running=len(self._rows),
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
            prompt_ids=list(prompt_ids),
            params=params,
            adapter=adapter,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            detokenizer=IncrementalDetokenizer(self.tokenizer, prompt_ids),
            stops=StopStrings(params.stop),
            generator=generator_for(params),
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
            if not self._rows and not self._queue:
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
            self._prefill(admitted, out)
        if self._rows:
            self._decode(out)
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
            if len(self._rows) + len(admitted) >= self.max_batch_size:
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
        slots: list[int],
        every_position: bool = False,
    ) -> torch.Tensor:
        """The next token's logits of each row ([rows, vocab]); ``every_position``: of every
        position ([rows, positions, vocab])."""
        self.lora.set_rows(slots, self.device)
        if len(set(slots)) > 1:
            self.mixed_forwards += 1
        try:
            output = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=0 if every_position else 1,
            )
        finally:
            self.lora.rows.index = None
        return output.logits if every_position else output.logits[:, -1, :]

    def _prefill(
        self, admitted: list[_Sequence], out: list[tuple[_Sequence, Piece | BaseException]]
    ) -> None:
        ids, mask, positions = KvBatch.prefill_inputs(
            [s.prompt_ids for s in admitted], self.pad_id, self.device
        )
        # Rows first: if the forward fails, _fail_all answers these requests too.
        self._rows.extend(admitted)
        cache = DynamicCache(config=self.model.config)
        slots = [s.slot for s in admitted]
        if any(s.params.prompt_logprobs for s in admitted):
            every = self._forward(ids, mask, positions, cache, slots, every_position=True)
            _score_prompts(admitted, every)
            logits = every[:, -1, :]
        else:
            logits = self._forward(ids, mask, positions, cache, slots)
        batch = KvBatch.from_prefill(cache, mask)
        if self._kv is None:
            self._kv = batch
        else:
            self._kv.extend(batch)
        self._sample(admitted, logits, out)

    def _decode(self, out: list[tuple[_Sequence, Piece | BaseException]]) -> None:
        # Rows admitted this turn already have their first token from the prefill; every row
        # still going now feeds its pending token.
        self._retire()
        if self._kv is None:
            return
        mask, positions = self._kv.step_inputs()
        ids = torch.tensor([[s.next_token] for s in self._rows], device=self.device)
        logits = self._forward(ids, mask, positions, self._kv.cache, [s.slot for s in self._rows])
        self.steps += 1
        self._sample(self._rows, logits, out)

    def _sample(
        self,
        rows: list[_Sequence],
        logits: torch.Tensor,
        out: list[tuple[_Sequence, Piece | BaseException]],
    ) -> None:
        allowed = self._allowed(rows, out) if any(s.constraint is not None for s in rows) else None
        params = [s.params for s in rows]
        tokens, logprobs = next_tokens(logits, params, [s.generator for s in rows], allowed)
        self.generated_tokens += len(tokens)
        for seq, token, logprob in zip(rows, tokens, logprobs, strict=True):
            if seq.done:  # its constraint failed just now
                continue
            if seq.constraint is not None:
                seq.constraint.advance(token)
            seq.next_token = token
            seq.generated += 1
            seq.tokens.append(token)
            if logprob is not None:
                seq.logprobs.append(logprob)
            finish: str | None = None
            stops: Collection[int] | None = seq.params.stop_tokens
            if stops is None:
                stops = () if seq.params.ignore_eos else self.eos_ids
            if token in stops:
                text = seq.stops.feed(seq.detokenizer.flush()) + seq.stops.finish()
                finish = "stop"
            else:
                text = seq.stops.feed(seq.detokenizer.add(token))
                if seq.stops.stopped:
                    finish = "stop"
                elif seq.generated >= seq.params.max_tokens:
                    text += seq.stops.feed(seq.detokenizer.flush()) + seq.stops.finish()
                    finish = "stop" if seq.stops.stopped else "length"
            if finish is not None:
                seq.done = True
                piece = Piece(
                    text,
                    seq.generated,
                    len(seq.prompt_ids),
                    finish_reason=finish,
                    tokens=tuple(seq.tokens),
                    logprobs=tuple(seq.logprobs) if seq.params.logprobs else None,
                    prompt_logprobs=(
                        tuple(seq.prompt_logprobs) if seq.prompt_logprobs is not None else None
                    ),
                )
                out.append((seq, piece))
            elif text:
                out.append((seq, Piece(text, seq.generated, len(seq.prompt_ids))))

    def _allowed(
        self, rows: list[_Sequence], out: list[tuple[_Sequence, Piece | BaseException]]
    ) -> list[list[int] | None]:
        """Each row's allowed token ids (None: any). A row whose constraint fails ends with
        the error; the batch goes on."""
        allowed: list[list[int] | None] = []
        for seq in rows:
            ids = None
            if seq.constraint is not None:
                try:
                    ids = seq.constraint.allowed()
                except JsonFormatError as exc:
                    seq.done = True
                    out.append((seq, InvalidRequest(str(exc))))
            allowed.append(ids)
        return allowed

    def _retire(self) -> None:
        """Drop rows that finished or whose caller went away; release their adapters."""
        keep = [i for i, s in enumerate(self._rows) if not (s.done or s.aborted)]
        if len(keep) == len(self._rows):
            return
        for seq in self._rows:
            if (seq.done or seq.aborted) and seq.adapter is not None:
                self.adapters.release(seq.adapter.key)
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._kv = None
        elif self._kv is not None:
            self._kv.keep(keep)

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
        victims = [*self._rows, *self._queue, *pending]
        for seq in self._rows:
            if seq.adapter is not None:
                self.adapters.release(seq.adapter.key)
        self._rows, self._queue, self._kv = [], deque(), None
        self._send([(seq, error) for seq in victims if not seq.done])


def _score_prompts(rows: list[_Sequence], logits: torch.Tensor) -> None:
    """Each asking row's prompt tokens' log-probabilities from a left-padded prefill's logits
    at every position (the logits at position ``p`` predict the token at ``p + 1``)."""
    width = logits.shape[1]
    for i, seq in enumerate(rows):
        if not seq.params.prompt_logprobs:
            continue
        n = len(seq.prompt_ids)
        start = width - n  # the row's first prompt token, after its padding
        predicted = logits[i, start : width - 1].float().log_softmax(-1)
        targets = torch.tensor(seq.prompt_ids[1:], device=logits.device)[:, None]
        scores = predicted.gather(1, targets)[:, 0].tolist()
        seq.prompt_logprobs = [float("nan"), *scores]


def _deliver(items: list[tuple[_Sequence, Piece | BaseException]]) -> None:
    for seq, item in items:
        seq.queue.put_nowait(item)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
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


def _pad_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    for value in (tokenizer.pad_token_id, getattr(model.config, "pad_token_id", None)):
        if isinstance(value, int):
            return value
    return next(iter(_eos_ids(model, tokenizer)), 0)

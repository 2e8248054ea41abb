"""A rank's training data, streamed from the store frame by frame, tokenized once.

The stored dataset is cut into frames (``swarm_runtime.dataset_frames``: a seekable zstd
object's own frames, about 1 MiB of JSONL each). Frames are the unit of everything here:

* **sharding**: rank ``r`` of ``W`` takes the contiguous ``r``-th ``W``-th of the frames, so
  it reads about ``1/W`` of the bytes. A dataset of fewer than ``MIN_FRAMES_PER_RANK * W``
  frames is small: every rank reads all of it and takes every ``W``-th training record of each
  frame, as ranks did before streaming;
* **holdout**: ``data.split_holdout`` frame by frame (frame ``f`` seeded ``seed + f * P``),
  so a frame's split needs nothing but the frame; a one-frame dataset is split as before;
* **tokenizing**: through the token cache (``token_cache``): a frame is tokenized by the
  first run that needs it, by the training method's ``encode_record`` (SFT: a record is one
  sequence; DPO: a preference pair's two), and read by every later one; the method makes its
  examples of a record's sequences and lays them out in micro-batches (``methods``);
* **order**: each epoch, a rank's frames in a seeded order, and each frame's records in a
  seeded order of their own (a shuffle bounded by one frame, not the whole share). The
  epochs follow one another as one endless stream, and micro-batch ``i`` is the stream's
  examples ``[i * batch_size, (i + 1) * batch_size)``: every training example of a rank's
  share once per epoch. Packing (the method's ``collate``) packs each micro-batch on its own,
  so its buffer is one micro-batch and packs exactly as before.

A thread reads, decompresses, parses and tokenizes the frames ahead of the loop, at most
``PREFETCH_FRAMES`` of them, so memory stays flat whatever the dataset's size.

Where the stream is (``Position``: epoch, frame ordinal in the epoch's order, offset in the
frame's order) is saved in each checkpoint, per rank (``stream_position``), and a resumed run
starts there: the same batches, in the same order, as the run that saved it would have seen.
A run with another number of ranks would cut other shares, so it is refused
(``stream_position.ResumeMismatch``) rather than resumed with other data.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarm_runtime.dataset_frames import DatasetFrames
from swarm_trainer.data import Batch, DatasetError, Example, Tokenizer, parse_jsonl, split_holdout
from swarm_trainer.methods.method import Method
from swarm_trainer.stream_position import Position
from swarm_trainer.task_eval import EvalRow, eval_row
from swarm_trainer.token_cache import FrameTokens, Layout, TokenCache

# Below this many frames per rank, a dataset is small: every rank reads all of it.
MIN_FRAMES_PER_RANK = 4
# Frames read, tokenized and waiting ahead of the loop.
PREFETCH_FRAMES = 2
# A rank evaluates at most this many held-out examples (the first ones of its share): a
# validation loss is an estimate, and collecting a tenth of a large dataset would hold it all.
VAL_EXAMPLES_PER_RANK = 256
# An example's ``source``: its frame, then its record in the frame, in these low bits.
RECORD_BITS = 24
# Frame ``f``'s holdout is seeded ``seed + f * _FRAME_SEED`` (frame 0: the job's own seed).
_FRAME_SEED = 1_000_003


def source_id(frame: int, record: int) -> int:
    return (frame << RECORD_BITS) | record


def parse_frame(data: bytes, frame: int) -> list[dict[str, Any]]:
    """The frame's records (blank lines skipped); ``DatasetError`` names a bad line."""
    return parse_jsonl(data.split(b"\n"), f"frame {frame}, ")


@dataclass(frozen=True)
class FrameSplit:
    train: list[int]
    val: list[int]
    evals: list[int]


@dataclass(frozen=True)
class Holdout:
    """Which records are held out of training: ``evals.fraction`` first (seed + 1), then
    ``val_fraction`` of the rest (seed), as ``split_holdout`` draws them, frame by frame."""

    val_fraction: float  # 0 when the job has a validation dataset of its own
    eval_fraction: float | None  # evals.fraction, when the task evals take it from here
    seed: int

    def split(self, records: int, frame: int) -> FrameSplit:
        seed = self.seed + frame * _FRAME_SEED
        train: list[int] = list(range(records))
        evals: list[int] = []
        if self.eval_fraction is not None:
            train, evals = split_holdout(train, self.eval_fraction, seed + 1)
        train, val = split_holdout(train, self.val_fraction, seed)
        return FrameSplit(train, val, evals)


class FrameSource:
    """One dataset's frames, as tokens (through the token cache, tokenized by ``method``) and
    as records.

    The stored dataset is opened only when a frame is not in the cache (or its records are
    wanted): a run whose frames are all cached never reads it."""

    def __init__(
        self,
        cache: TokenCache,
        method: Method,
        tokenizer: Tokenizer,
        seq_len: int,
        open_raw: Callable[[], DatasetFrames],
    ):
        if cache.sequences != method.sequences:
            raise ValueError(
                f"a token cache of {cache.sequences}-sequence records for {method.name}"
            )
        self.cache = cache
        self.method = method
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self._open_raw = open_raw
        self._raw: DatasetFrames | None = None
        self._lock = threading.Lock()
        self._known = cache.layout()
        self.cached = self._known is not None  # the entry was there before this run
        if self._known is None:
            raw = self.raw()
            self._known = Layout(raw.count, raw.layout)
            cache.put_layout(self._known)
        self.count = self._known.frames

    def raw(self) -> DatasetFrames:
        with self._lock:
            if self._raw is None:
                raw = self._open_raw()
                known = self._known
                if known is not None and (raw.count, raw.layout) != (known.frames, known.cut):
                    raise DatasetError(
                        f"the token cache {self.cache.prefix} was cut into {known.frames} "
                        f"frames ({known.cut}), the stored dataset into {raw.count} "
                        f"({raw.layout})"
                    )
                self._raw = raw
            return self._raw

    @property
    def bytes_read(self) -> int:
        """From the store: the dataset's bytes and the cached tokens'."""
        raw = self._raw.bytes_read if self._raw is not None else 0
        return raw + self.cache.bytes_read

    def records(self, frame: int) -> list[dict[str, Any]]:
        return parse_frame(self.raw().read(frame), frame)

    def tokens(self, frame: int) -> FrameTokens:
        found = self.cache.get(frame)
        if found is not None:
            return found
        sequences: list[Example | None] = []
        for number, record in enumerate(self.records(frame), 1):
            try:
                encoded = self.method.encode_record(record, self.tokenizer, self.seq_len)
            except DatasetError as exc:
                raise DatasetError(f"frame {frame}, record {number}: {exc}") from exc
            sequences.extend(encoded or [None] * self.method.sequences)
        tokens = FrameTokens.of(sequences, self.method.sequences)
        self.cache.put(frame, tokens)
        return tokens

    def example(self, tokens: FrameTokens, frame: int, record: int) -> Any:
        """The method's example of the frame's record (SFT: an ``Example``; DPO: a pair)."""
        source = source_id(frame, record)
        return self.method.example(tokens.examples(record, source), source)


@dataclass(frozen=True)
class Share:
    """Which frames a rank reads, and whether it takes every ``world``-th training record of
    each (a small dataset) or all of them."""

    rank: int
    world: int
    frames: tuple[int, ...]
    interleaved: bool

    @classmethod
    def of(cls, frames: int, rank: int, world: int) -> Share:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of {world}")
        if frames < MIN_FRAMES_PER_RANK * world:
            return cls(rank, world, tuple(range(frames)), interleaved=True)
        mine = range(rank * frames // world, (rank + 1) * frames // world)
        return cls(rank, world, tuple(mine), interleaved=False)

    def mine(self, records: list[int]) -> list[int]:
        return records[self.rank :: self.world] if self.interleaved else records


@dataclass
class _Frame:
    epoch: int
    ordinal: int
    frame: int
    tokens: FrameTokens
    picks: list[int]  # its records this rank trains on, in this epoch's order


class _Prefetcher:
    """A thread that loads the stream's frames in order from ``start``, ahead of the loop."""

    def __init__(self, stream: TrainStream, start: Position, depth: int) -> None:
        self._stream = stream
        self._queue: queue.Queue[_Frame | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(start.epoch, start.ordinal), name="swarm-data", daemon=True
        )
        self._thread.start()

    def _run(self, epoch: int, ordinal: int) -> None:
        try:
            while not self._stop.is_set():
                if ordinal == len(self._stream.share.frames):
                    epoch, ordinal = epoch + 1, 0
                self._put(self._stream.load(epoch, ordinal))
                ordinal += 1
        except BaseException as exc:  # handed to the loop, which raises it
            self._put(exc)

    def _put(self, item: _Frame | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def get(self) -> _Frame:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class TrainStream:
    """Micro-batch ``i`` of one rank's endless stream (see the module's docstring).

    Asked for in order (``StepBatches`` does), it reads on; asked for another index, it moves
    there: to a position it has passed recently or been told (``seek``), else by counting
    examples from the start."""

    # Positions kept for the micro-batches just produced (a checkpoint asks for one of them;
    # the loop runs up to two steps of at most 1024 micro-batches ahead of it).
    _KEEP = 4096

    def __init__(
        self,
        source: FrameSource,
        share: Share,
        holdout: Holdout,
        batch_size: int,
        pad_id: int,
        seed: int,
        pack_to: int | None = None,
        prefetch: int = PREFETCH_FRAMES,
    ) -> None:
        if not share.frames:
            raise DatasetError("this worker's shard of the training set is empty")
        self.source = source
        self.share = share
        self.holdout = holdout
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.seed = seed
        self.pack_to = pack_to
        self.prefetch = prefetch
        self._cursor = Position()
        self._current: _Frame | None = None
        self._prefetcher: _Prefetcher | None = None
        self._next_index = 0
        self._positions: dict[int, Position] = {0: Position()}
        self._empty_frames = 0

    # --- what the loop uses ----------------------------------------------------------------

    def batch(self, index: int) -> Batch:
        if index != self._next_index:
            self.seek(index, self._positions.get(index))
        examples = self._take(self.batch_size)
        self._next_index = index + 1
        self._positions[index + 1] = self._cursor
        for old in [i for i in self._positions if i <= index + 1 - self._KEEP]:
            del self._positions[old]
        return self.source.method.collate(examples, self.pad_id, self.pack_to)

    def position(self, index: int) -> Position:
        """Where micro-batch ``index`` starts (one the stream produced lately, or the next)."""
        if index not in self._positions:
            raise KeyError(f"the stream has no position for micro-batch {index}")
        return self._positions[index]

    def seek(self, index: int, position: Position | None) -> None:
        """Make micro-batch ``index`` the next one; ``position``: where it starts, if known
        (else the stream counts its way there from the start, reading every frame before)."""
        self._restart(position or Position())
        if position is None:
            self._skip(index * self.batch_size)
        self._next_index = index
        self._positions = {index: self._cursor}

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    # --- the stream ------------------------------------------------------------------------

    def order(self, epoch: int) -> list[int]:
        """The rank's frames in epoch ``epoch``'s order."""
        order = list(self.share.frames)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def load(self, epoch: int, ordinal: int) -> _Frame:
        """The ``ordinal``-th frame of epoch ``epoch``, its training examples in order."""
        frame = self.order(epoch)[ordinal]
        tokens = self.source.tokens(frame)
        train = self.share.mine(self.holdout.split(tokens.records, frame).train)
        picks = [i for i in train if tokens.length(i) > 0]
        random.Random(f"{self.seed}:{epoch}:{frame}").shuffle(picks)
        return _Frame(epoch, ordinal, frame, tokens, picks)

    def _restart(self, at: Position) -> None:
        self.close()
        self._cursor = at
        self._current = None
        self._empty_frames = 0

    def _frame(self) -> _Frame:
        """The frame under the cursor, moving past frames without examples."""
        while True:
            if self._current is None:
                if self._prefetcher is None:
                    self._prefetcher = _Prefetcher(self, self._cursor, self.prefetch)
                loaded = self._prefetcher.get()
                assert (loaded.epoch, loaded.ordinal) == (self._cursor.epoch, self._cursor.ordinal)
                self._current = loaded
                self._empty_frames = self._empty_frames + 1 if not loaded.picks else 0
                if self._empty_frames > len(self.share.frames):
                    raise DatasetError(
                        "this worker's shard of the training set has no example with a target "
                        "token left after truncation to seq_len"
                    )
            if self._cursor.offset < len(self._current.picks):
                return self._current
            self._next_frame()

    def _next_frame(self) -> None:
        epoch, ordinal = self._cursor.epoch, self._cursor.ordinal + 1
        if ordinal == len(self.share.frames):
            epoch, ordinal = epoch + 1, 0
        self._cursor = Position(epoch, ordinal, 0)
        self._current = None

    def _take(self, n: int) -> list[Any]:
        examples: list[Any] = []
        while len(examples) < n:
            current = self._frame()
            record = current.picks[self._cursor.offset]
            examples.append(self.source.example(current.tokens, current.frame, record))
            self._cursor = Position(
                self._cursor.epoch, self._cursor.ordinal, self._cursor.offset + 1
            )
        return examples

    def _skip(self, n: int) -> None:
        while n > 0:
            current = self._frame()
            step = min(n, len(current.picks) - self._cursor.offset)
            self._cursor = Position(
                self._cursor.epoch, self._cursor.ordinal, self._cursor.offset + step
            )
            n -= step


# --- held-out data ---------------------------------------------------------------------------


def validation_examples(
    source: FrameSource,
    share: Share,
    holdout: Holdout,
    limit: int = VAL_EXAMPLES_PER_RANK,
    evals: bool = True,
) -> list[Any]:
    """This rank's held-out examples for the validation loss: the first ``limit`` of its
    frames' (a small dataset: every ``world``-th of all of them, none when there are fewer
    than ``world``). The held-out set is ``val_fraction``'s, else (``evals``) that of
    ``evals.fraction``."""
    use_val = holdout.val_fraction > 0
    if not use_val and (holdout.eval_fraction is None or not evals):
        return []
    chosen: list[Any] = []
    seen = 0
    for frame in share.frames:
        tokens = source.tokens(frame)
        split = holdout.split(tokens.records, frame)
        for record in split.val if use_val else split.evals:
            mine = seen % share.world == share.rank if share.interleaved else True
            seen += 1
            if mine and tokens.length(record) > 0:
                chosen.append(source.example(tokens, frame, record))
                if len(chosen) >= limit:
                    return chosen
    return [] if share.interleaved and seen < share.world else chosen


def held_out_rows(source: FrameSource, holdout: Holdout, limit: int) -> list[EvalRow]:
    """The task evals' rows: the first ``limit`` gradable records held out by
    ``evals.fraction`` (else by ``val_fraction``), in dataset order; every rank has them all."""
    rows: list[EvalRow] = []
    for frame in range(source.count):
        records = source.records(frame)
        split = holdout.split(len(records), frame)
        for record in split.evals if holdout.eval_fraction is not None else split.val:
            row = eval_row(records[record])
            if row is not None:
                rows.append(row)
                if len(rows) >= limit:
                    return rows
    if not rows:
        raise DatasetError(
            "the eval set has no prompt/completion or chat row ending in an assistant turn to grade"
        )
    return rows

"""A streamed training set (``swarm_trainer.stream``) on a real store with a real tokenizer:
every example exactly once per epoch across the ranks, nothing held out trained on, the token
cache written once and read after (a missing, half-written or foreign frame is never used),
an exact resume mid-epoch from a saved position, and a damaged dataset an error."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from swarm_contracts.layout import TOKEN_LAYOUT, join_key, token_frame_key
from swarm_runtime.dataset_codec import CorruptDataset
from swarm_runtime.dataset_frames import DatasetFrames, ZstdFrames, open_frames
from swarm_runtime.store import LocalStore
from swarm_trainer.data import IGNORE_INDEX, Batch, DatasetError, Example, split_holdout
from swarm_trainer.methods import Dpo, Method, Sft
from swarm_trainer.methods.dpo import PairBatch
from swarm_trainer.stream import (
    FrameSource,
    FrameSplit,
    Holdout,
    Share,
    TrainStream,
    source_id,
    validation_examples,
)
from swarm_trainer.stream_position import Position, ResumeMismatch, load_position, save_position
from swarm_trainer.token_cache import (
    CorruptTokens,
    FrameTokens,
    TokenCache,
    decode_frame,
    encode_frame,
    evict_entries,
    tokenizer_digest,
)

from .conftest import put_dataset

SEQ_LEN = 48
# Frames of about 2 KiB: a few hundred records make dozens of frames.
FRAME = 2048


def records(n: int) -> list[dict[str, Any]]:
    # Varied lengths; every 13th is all prompt after truncation to SEQ_LEN: nothing to learn.
    return [
        {
            "prompt": f"Q{i}: " + "word " * (60 if i % 13 == 0 else i % 9),
            "completion": f" {i}" + " x" * (i % 5),
        }
        for i in range(n)
    ]


class Setup:
    def __init__(
        self,
        tmp_path: Path,
        tokenizer: Any,
        model_dir: Path,
        n: int = 400,
        method: Method | None = None,
        make: Callable[[int], list[dict[str, Any]]] = records,
    ) -> None:
        self.store = LocalStore(tmp_path / "store")
        self.tmp_path = tmp_path
        self.tokenizer = tokenizer
        self.digest = tokenizer_digest(model_dir)
        self.method = method or Sft()
        self.info = put_dataset(self.store, make(n), frame_bytes=FRAME)
        self.opened = 0

    def cache(self, name: str, writable: bool = True) -> TokenCache:
        return TokenCache.of(
            self.store,
            self.info,
            self.digest,
            SEQ_LEN,
            self.method.encoding,
            self.tmp_path / name,
            writable,
            self.method.sequences,
        )

    def raw(self) -> DatasetFrames:
        self.opened += 1
        frames = open_frames(self.store, self.info.store_key)
        assert frames is not None
        return frames

    def source(self, name: str, writable: bool = True) -> FrameSource:
        cache = self.cache(name, writable)
        return FrameSource(cache, self.method, self.tokenizer, SEQ_LEN, self.raw)

    def stream(
        self, name: str, rank: int = 0, world: int = 1, batch_size: int = 4, **kwargs: Any
    ) -> TrainStream:
        source = self.source(name)
        return TrainStream(
            source,
            Share.of(source.count, rank, world),
            HOLDOUT,
            batch_size,
            pad_id=0,
            seed=7 + rank,
            **kwargs,
        )


HOLDOUT = Holdout(val_fraction=0.1, eval_fraction=0.05, seed=3)


@pytest.fixture
def setup(tmp_path: Path, tokenizer: Any, tiny_model_dir: Path) -> Setup:
    return Setup(tmp_path, tokenizer, tiny_model_dir)


def trainable(setup: Setup) -> set[int]:
    """Every training example of the dataset: not held out, something to learn."""
    source = setup.source("all")
    found = set()
    for frame in range(source.count):
        tokens = source.tokens(frame)
        for record in HOLDOUT.split(tokens.records, frame).train:
            if tokens.length(record) > 0:
                found.add(source_id(frame, record))
    return found


def epoch_sources(stream: TrainStream, epoch: int) -> list[int]:
    found = []
    for ordinal in range(len(stream.share.frames)):
        loaded = stream.load(epoch, ordinal)
        found += [source_id(loaded.frame, record) for record in loaded.picks]
    return found


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_example_once_per_epoch_across_the_ranks(setup: Setup, world: int) -> None:
    expected = trainable(setup)
    assert 250 < len(expected) < 370  # held out and empty ones left out
    frames = setup.source("n").count
    assert frames >= 4 * 3  # sharded by frames, not interleaved
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        shares = []
        for rank in range(world):
            stream = setup.stream(f"r{rank}", rank, world)
            shares.append(set(stream.share.frames))
            seen.update(epoch_sources(stream, epoch))
        assert set(seen) == expected
        assert max(seen.values()) == 1
        # Disjoint frames: each rank reads only its own.
        assert sum(len(s) for s in shares) == frames
        assert set.union(*shares) == set(range(frames))


def test_the_batches_follow_the_epochs_and_a_new_epoch_reshuffles(setup: Setup) -> None:
    stream = setup.stream("b", batch_size=1)
    first = epoch_sources(stream, 0)
    taken = [stream.batch(i).sources[0] for i in range(2 * len(first))]
    assert taken[: len(first)] == first
    assert sorted(taken[len(first) :]) == sorted(first)
    assert taken[len(first) :] != first


def test_a_small_dataset_is_interleaved_like_before(
    tmp_path: Path, tokenizer: Any, tiny_model_dir: Path
) -> None:
    small = Setup(tmp_path, tokenizer, tiny_model_dir, n=30)
    seen: Counter[int] = Counter()
    for rank in range(2):
        stream = small.stream(f"r{rank}", rank, 2)
        assert stream.share.interleaved
        assert stream.share.frames == tuple(range(small.source("n").count))
        seen.update(epoch_sources(stream, 0))
    assert set(seen) == trainable(small)
    assert max(seen.values()) == 1


def test_nothing_held_out_is_trained_on(setup: Setup) -> None:
    source = setup.source("h")
    held: set[int] = set()
    for frame in range(source.count):
        split = HOLDOUT.split(source.tokens(frame).records, frame)
        held |= {source_id(frame, r) for r in split.val + split.evals}
    assert held
    assert not held & trainable(setup)
    val = validation_examples(source, Share.of(source.count, 0, 2), HOLDOUT, limit=1000)
    assert val
    assert {e.source for e in val} <= held
    assert len(validation_examples(source, Share.of(source.count, 0, 2), HOLDOUT, limit=5)) == 5


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        x.sources == y.sources
        and x.inputs.keys() == y.inputs.keys()
        and all(torch.equal(x.inputs[k], y.inputs[k]) for k in x.inputs)
        for x, y in zip(a, b, strict=True)
    )


def test_tokenized_once_then_read_from_the_cache(setup: Setup) -> None:
    first = setup.stream("first", batch_size=3, pack_to=SEQ_LEN)
    reference = [first.batch(i) for i in range(60)]
    frames = setup.source("n").count
    # The first run wrote the layout and every frame it read.
    prefix = setup.cache("x").prefix
    written = setup.store.list(prefix + "/")
    assert join_key(prefix, TOKEN_LAYOUT) in written
    assert len(written) > 1
    opened = setup.opened

    # A later run on a fresh machine reads the tokens, never the dataset.
    for frame in range(frames):
        setup.source("fill").tokens(frame)
    setup.opened = opened
    later = setup.stream("later", batch_size=3, pack_to=SEQ_LEN)
    assert later.source.cached
    assert same([later.batch(i) for i in range(60)], reference)
    assert setup.opened == opened
    assert later.source.cache.hits > 0


def test_a_workers_next_run_reads_its_own_copies_and_drops_a_bad_one(setup: Setup) -> None:
    first = setup.source("worker")
    for frame in range(first.count):
        first.tokens(frame)
    opened = setup.opened
    # The same worker's next run (a retry, a sweep's next trial): its disk, not the store.
    again = setup.source("worker")
    for frame in range(again.count):
        again.tokens(frame)
    assert again.cache.local_hits == again.count
    assert again.cache.bytes_read == 0
    assert setup.opened == opened
    # A damaged local copy is never trained on: read from the store again, and kept anew.
    damaged = again.cache.local / "frame-000000.safetensors.zst"
    damaged.write_bytes(b"not a frame")
    third = setup.source("worker")
    assert third.tokens(0).records == again.tokens(0).records
    assert (third.cache.hits, third.cache.local_hits) == (1, 0)
    assert damaged.read_bytes() != b"not a frame"


def test_the_least_recently_used_token_entries_go_first(tmp_path: Path) -> None:
    entries = [tmp_path / name for name in ("old", "mine", "newer")]
    for age, entry in zip((300, 200, 100), entries, strict=True):
        entry.mkdir()
        (entry / "frame-000000.safetensors.zst").write_bytes(b"x" * 100)
        os.utime(entry, (time.time() - age, time.time() - age))
    old, mine, newer = entries
    # 300 bytes, a limit of 150: the oldest goes, then the next, but never the caller's own.
    assert evict_entries(tmp_path, 150, keep=old) == [mine, newer]
    assert old.exists()
    assert evict_entries(tmp_path, 1000, keep=old) == []


def test_a_missing_or_foreign_frame_is_tokenized_again_never_used(setup: Setup) -> None:
    reference_stream = setup.stream("ref", batch_size=4)
    reference = [reference_stream.batch(i) for i in range(40)]
    source = setup.source("fill")
    for frame in range(source.count):
        source.tokens(frame)
    prefix = setup.cache("x").prefix
    order = reference_stream.order(0)
    # A writer killed mid-put leaves no frame (a put is whole) but maybe a stray temp file;
    # a bug or a forger leaves another frame's tokens under this frame's key.
    setup.store.delete(token_frame_key(prefix, order[0]))
    entry_dir = setup.store.root / prefix
    (entry_dir / f".tmp-{'0' * 32}").write_bytes(b"half a frame")
    setup.store.put_bytes(
        token_frame_key(prefix, order[1]),
        setup.store.get_bytes(token_frame_key(prefix, order[2])),
    )
    again = setup.stream("again", batch_size=4)
    assert same([again.batch(i) for i in range(40)], reference)
    assert setup.store.exists(token_frame_key(prefix, order[0]))  # put back whole


def test_a_worker_without_store_keys_reads_the_cache_but_never_writes_it(setup: Setup) -> None:
    source = setup.source("ro", writable=False)
    source.tokens(0)
    assert setup.store.list("tokens/") == []


def test_resume_mid_epoch_gives_the_same_batches(setup: Setup, tmp_path: Path) -> None:
    stream = setup.stream("a", batch_size=5, pack_to=SEQ_LEN)
    per_epoch = len(epoch_sources(stream, 0)) // 5
    total = per_epoch + per_epoch // 2 + 3  # into the second epoch
    reference = [stream.batch(i) for i in range(total)]
    at = per_epoch // 2 + 1  # mid-epoch, mid-frame
    assert stream.position(total).epoch == 1

    # The position a checkpoint at micro-batch ``at`` would have saved.
    replay = setup.stream("a2", batch_size=5, pack_to=SEQ_LEN)
    for i in range(at + 2):  # the loop prepares the next step ahead of a checkpoint
        replay.batch(i)
    saved = replay.position(at)
    assert saved.offset > 0
    save_position(tmp_path, 0, 1, at, saved, setup.info.sha256)
    replay.close()

    resumed = setup.stream("b", batch_size=5, pack_to=SEQ_LEN)
    resumed.seek(at, load_position(tmp_path, 0, 1, at, setup.info.sha256))
    assert same([resumed.batch(i) for i in range(at, total)], reference[at:])
    # A checkpoint from before positions were saved: counted from the start, same batches.
    counted = setup.stream("c", batch_size=5, pack_to=SEQ_LEN)
    counted.seek(at, None)
    assert same([counted.batch(i) for i in range(at, total)], reference[at:])


def test_another_number_of_workers_is_refused_another_dataset_counted(tmp_path: Path) -> None:
    save_position(tmp_path, 0, 2, 8, Position(0, 3, 1), "sha-a")
    save_position(tmp_path, 1, 2, 8, Position(0, 2, 0), "sha-a")
    assert load_position(tmp_path, 1, 2, 8, "sha-a") == Position(0, 2, 0)
    with pytest.raises(ResumeMismatch, match="saved by 2 workers and this run has 3"):
        load_position(tmp_path, 2, 3, 8, "sha-a")
    with pytest.raises(ResumeMismatch, match="saved by 2 workers and this run has 1:"):
        load_position(tmp_path, 0, 1, 8, "sha-a")
    assert load_position(tmp_path / "nothing", 0, 1, 8, "sha-a") is None
    # A fork that takes the training state on to other data: the saved place is another
    # dataset's, so the stream counts its way to micro-batch 8 of its own.
    assert load_position(tmp_path, 0, 1, 8, "sha-b") is None


def test_a_damaged_dataset_is_a_clear_error(setup: Setup) -> None:
    frames = setup.raw()
    assert isinstance(frames, ZstdFrames)
    packed = bytearray(setup.store.get_bytes(setup.info.store_key))
    for frame in frames.frames:
        packed[frame.offset + frame.size // 2] ^= 0xFF
    setup.store.put_bytes(setup.info.store_key, bytes(packed))
    stream = setup.stream("bad")
    with pytest.raises(CorruptDataset, match="corrupt"):
        stream.batch(0)
    stream.close()


def test_a_share_with_nothing_to_learn_is_an_error(
    tmp_path: Path, tokenizer: Any, tiny_model_dir: Path
) -> None:
    setup = Setup(tmp_path, tokenizer, tiny_model_dir, n=0)
    setup.info = put_dataset(setup.store, [{"prompt": "only a prompt " * 40, "completion": "a"}])
    stream = setup.stream("empty")
    with pytest.raises(DatasetError, match="no example with a target token"):
        stream.batch(0)
    stream.close()


def pairs(n: int) -> list[dict[str, Any]]:
    # Every 11th prompt fills SEQ_LEN: neither answer is left, so the pair is dropped.
    return [
        {
            "prompt": f"Q{i}: " + "word " * (60 if i % 11 == 0 else i % 7),
            "chosen": f" {i}" + " x" * (i % 4),
            "rejected": f" {i + 1}",
        }
        for i in range(n)
    ]


def test_a_dpo_stream_gives_every_pair_once_per_epoch_in_pair_batches(
    tmp_path: Path, tokenizer: Any, tiny_model_dir: Path
) -> None:
    """DPO streams as SFT does: a record's two sequences are cached together, and a
    micro-batch holds whole pairs, both sequences packed in it."""
    dpo = Dpo(0.1, reference=None)  # type: ignore[arg-type]  # batches need no model
    setup = Setup(tmp_path, tokenizer, tiny_model_dir, method=dpo, make=pairs)
    source = setup.source("dpo")
    assert source.count >= 4 * 2
    tokens = source.tokens(0)
    assert tokens.sequences == 2
    assert len(tokens.offsets) == 2 * tokens.records + 1
    expected = {
        source_id(frame, record)
        for frame in range(source.count)
        for record in HOLDOUT.split(source.tokens(frame).records, frame).train
        if source.tokens(frame).length(record) > 0
    }
    seen: Counter[int] = Counter()
    for rank in range(2):
        stream = setup.stream(f"r{rank}", rank, 2, batch_size=3, pack_to=4 * SEQ_LEN)
        seen.update(epoch_sources(stream, 0))
        batch = stream.batch(0)
        assert isinstance(batch, PairBatch)
        assert batch.pairs == 3
        assert len(batch.sources) == 3
        # Every pair's chosen and rejected sequences, each with its targets.
        assert sorted(set(batch.sequence.tolist())) == list(range(6))
        stream.close()
    assert set(seen) == expected
    assert max(seen.values()) == 1

    # A later run reads the pairs from the cache: the same batches, the dataset never opened.
    reference = setup.stream("ref", batch_size=3)
    first = [reference.batch(i) for i in range(12)]
    reference.close()
    opened = setup.opened
    later = setup.stream("later", batch_size=3)
    assert same([later.batch(i) for i in range(12)], first)
    assert setup.opened == opened
    later.close()


def test_a_frame_file_holds_exactly_its_tokens_and_says_whose_it_is() -> None:
    examples = [
        Example([1, 2, 70_000], [IGNORE_INDEX, 2, 70_000]),
        None,  # nothing to learn from: kept, empty
        Example([5, 6], [5, IGNORE_INDEX]),
    ]
    tokens = FrameTokens.of(examples)
    assert tokens.input_ids.dtype == np.int32  # an id past 16 bits
    assert FrameTokens.of(examples[1:]).input_ids.dtype == np.uint16
    data = encode_frame(tokens, {"frame": "3"})
    back = decode_frame(data, {"frame": "3"})
    assert back.records == 3
    assert back.length(1) == 0
    assert back.examples(0, 9) == (Example([1, 2, 70_000], [IGNORE_INDEX, 2, 70_000], 9),)
    assert back.examples(2, 11) == (Example([5, 6], [5, IGNORE_INDEX], 11),)
    with pytest.raises(CorruptTokens, match="another one's"):
        decode_frame(data, {"frame": "4"})
    with pytest.raises(CorruptTokens, match="does not decode"):
        decode_frame(data[:-10], {"frame": "3"})
    # A label that is neither its token nor ignored cannot be kept as a mask: refused.
    with pytest.raises(ValueError, match="mask"):
        FrameTokens.of([Example([1, 2], [1, 3])])
    # Records of two sequences (a DPO pair's): both kept, in order, the empty one's too.
    paired = FrameTokens.of([*examples, Example([7], [7])], sequences=2)
    assert paired.records == 2
    assert paired.length(0) == 3
    back = decode_frame(encode_frame(paired, {"frame": "3"}), {"frame": "3"}, sequences=2)
    assert back.examples(1, 5) == (Example([5, 6], [5, IGNORE_INDEX], 5), Example([7], [7], 5))
    with pytest.raises(CorruptTokens, match="do not fit"):
        decode_frame(encode_frame(tokens, {"frame": "3"}), {"frame": "3"}, sequences=2)


def test_a_one_frame_dataset_is_held_out_as_before_streaming() -> None:
    """Frame 0 is split with the job's own seeds, as the whole dataset was: evals first
    (seed + 1), then validation from the rest (seed)."""
    records = list(range(40))
    rest, evals = split_holdout(records, 0.2, 8)
    train, val = split_holdout(rest, 0.1, 7)
    assert Holdout(0.1, 0.2, 7).split(40, 0) == FrameSplit(train, val, evals)
    # Other frames draw their own.
    assert Holdout(0.1, 0.2, 7).split(40, 1) != FrameSplit(train, val, evals)

"""Tokenize once: a dataset's frames as tokens, kept in the store for every later run.

An entry (``layout.token_cache_prefix``) holds one dataset tokenized one way: by one
tokenizer (the digest of its files), truncated to one ``seq_len``, by one encoding (the
training method's tokenizing of a record, ``Method.encoding``, and ``FORMAT_VERSION``). The
first run that needs a frame tokenizes it and puts it there; retries, replays, a sweep's
trials and later jobs read it. Every object is written whole (a store put is atomic; the
local store renames a finished file into place), so no reader ever sees half of one, and
each names in its metadata what it holds, checked on every read: a frame of the wrong entry
is refused, never trained on.

A frame's file: safetensors of plain arrays (no pickle), zstd-compressed. ``input_ids``
(uint16 when every id fits, else int32) and ``trained`` (uint8: 1 where the token is a
target, the label being the token itself) laid end to end, and ``offsets`` (int64): sequence
``j`` is ``[offsets[j], offsets[j + 1])``. A record is the method's number of sequences in a
row (SFT: one; DPO: two, prompt + chosen then prompt + rejected), all empty when the record
leaves nothing to learn from. Every record of the frame is there, held-out ones too: the
split is the job's (its seed), the tokens are not.

A worker without store keys (a provider's) reads entries but never writes them: what it
wrote, other tenants' jobs and their verification replays would train on unchecked.

A worker keeps the frames it read or made in its own directory (the transfer cache's
``tokens/``, one subdirectory per entry), so its next run of the same entry (a retry, a
sweep's next trial, a replay, another epoch) reads them from disk, not the store. A local
frame is checked like a stored one (a bad one is dropped and read again); the least recently
used entries go once the directory outgrows its share of the cache (``evict_entries``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.layout import TOKEN_LAYOUT, join_key, token_cache_prefix, token_frame_key
from swarm_runtime.store import NotFound, ObjectStore, sha256_file, tree_digest
from swarm_trainer.data import IGNORE_INDEX, Example

log = logging.getLogger(__name__)

# Bump when the frame file's layout or meaning changes: old entries are then never read.
FORMAT_VERSION = 1
# What a tokenizer's behaviour depends on, beside the library: its files with these names.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_ZSTD_LEVEL = 3


class CorruptTokens(ValueError):
    """A cached frame that is not what its key says: another entry's, or damaged."""


def tokenizer_digest(model_dir: Path) -> str:
    """One digest of the tokenizer files in ``model_dir`` (names and contents)."""
    files = {
        name: sha256_file(model_dir / name)
        for name in TOKENIZER_FILES
        if (model_dir / name).is_file()
    }
    if not files:
        raise ValueError(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}…)")
    return tree_digest(files)


@dataclass(frozen=True)
class FrameTokens:
    """One frame's records, tokenized (see the module's docstring)."""

    input_ids: np.ndarray
    trained: np.ndarray
    offsets: np.ndarray  # by sequence
    sequences: int = 1  # per record

    @property
    def records(self) -> int:
        return (len(self.offsets) - 1) // self.sequences

    def length(self, record: int) -> int:
        """The tokens of all its sequences: 0 when it has nothing to learn from."""
        first = record * self.sequences
        return int(self.offsets[first + self.sequences] - self.offsets[first])

    def examples(self, record: int, source: int) -> tuple[Example, ...]:
        """Its sequences, in the order the method encoded them."""
        first = record * self.sequences
        return tuple(self._sequence(j, source) for j in range(first, first + self.sequences))

    def _sequence(self, j: int, source: int) -> Example:
        lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
        ids = self.input_ids[lo:hi].astype(np.int64)
        labels = np.where(self.trained[lo:hi] != 0, ids, IGNORE_INDEX)
        return Example(ids.tolist(), labels.tolist(), source)

    @classmethod
    def of(cls, examples: Sequence[Example | None], sequences: int = 1) -> FrameTokens:
        """Record ``i``'s sequences are ``examples[i * sequences : (i + 1) * sequences]``;
        ``None``: a record's with nothing to learn from (kept, empty, so indices line up)."""
        if len(examples) % sequences:
            raise ValueError(f"{len(examples)} sequences are not records of {sequences}")
        ids: list[np.ndarray] = []
        trained: list[np.ndarray] = []
        offsets = [0]
        for e in examples:
            if e is not None:
                tokens = np.asarray(e.input_ids, dtype=np.int64)
                labels = np.asarray(e.labels, dtype=np.int64)
                target = labels != IGNORE_INDEX
                if not np.array_equal(labels[target], tokens[target]):
                    raise ValueError(
                        "the token cache keeps labels as a mask over the input ids: an "
                        "example has a label that is neither its token nor ignored"
                    )
                ids.append(tokens)
                trained.append(target)
            offsets.append(offsets[-1] + (len(e.input_ids) if e is not None else 0))
        all_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        # Most vocabularies fit 16 bits: half the bytes to store, to read and to decompress.
        small = len(all_ids) == 0 or int(all_ids.max()) < 2**16
        return cls(
            all_ids.astype(np.uint16 if small else np.int32),
            (np.concatenate(trained) if trained else np.zeros(0, dtype=bool)).astype(np.uint8),
            np.asarray(offsets, dtype=np.int64),
            sequences,
        )


def encode_frame(tokens: FrameTokens, identity: dict[str, str]) -> bytes:
    arrays = {"input_ids": tokens.input_ids, "trained": tokens.trained, "offsets": tokens.offsets}
    data = save_arrays(arrays, metadata=identity)
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compress(data)


def decode_frame(data: bytes, identity: dict[str, str], sequences: int = 1) -> FrameTokens:
    """The frame in ``data``, which must say it is ``identity``'s (``CorruptTokens`` if not),
    of records of ``sequences`` sequences."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(data)
        (header_len,) = struct.unpack_from("<Q", raw)
        header = json.loads(raw[8 : 8 + header_len])
        arrays = load_arrays(raw)
    except (zstandard.ZstdError, struct.error, ValueError) as exc:
        raise CorruptTokens(f"a cached token frame does not decode: {exc}") from exc
    meta = header.get("__metadata__") or {}
    wrong = {k: (meta.get(k), v) for k, v in identity.items() if meta.get(k) != v}
    if wrong:
        raise CorruptTokens(f"a cached token frame is another one's: {wrong}")
    try:
        tokens = FrameTokens(arrays["input_ids"], arrays["trained"], arrays["offsets"], sequences)
    except KeyError as exc:
        raise CorruptTokens(f"a cached token frame lacks {exc}") from exc
    if (
        tokens.input_ids.dtype not in (np.uint16, np.int32)
        or tokens.offsets.dtype != np.int64
        or len(tokens.trained) != len(tokens.input_ids)
        or len(tokens.offsets) == 0
        or (len(tokens.offsets) - 1) % sequences
        or tokens.offsets[-1] != len(tokens.input_ids)
    ):
        raise CorruptTokens("a cached token frame's arrays do not fit together")
    return tokens


@dataclass(frozen=True)
class Layout:
    """How many frames the dataset has, and how it was cut into them
    (``DatasetFrames.layout``)."""

    frames: int
    cut: str


class TokenCache:
    """One entry, seen by one run: the worker's local copies first (a frame read before, by
    this run or an earlier one on this worker, is read from disk), then the store's."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        local: Path,
        identity: dict[str, str],
        writable: bool,
        sequences: int = 1,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.local = local
        self.identity = {**identity, "format": str(FORMAT_VERSION)}
        self.writable = writable
        self.sequences = sequences  # per record: the encoding's
        self.hits = 0  # frames found in the store's entry
        self.local_hits = 0  # frames found on this worker's disk
        self.bytes_read = 0  # from the store
        local.mkdir(parents=True, exist_ok=True)
        os.utime(local)  # recently used: the last entry evicted

    @classmethod
    def of(
        cls,
        store: ObjectStore,
        dataset: DatasetInfo,
        tokenizer: str,
        seq_len: int,
        encoding: str,
        local: Path,
        writable: bool,
        sequences: int = 1,
    ) -> TokenCache:
        """The entry of ``dataset`` tokenized by the tokenizer whose digest is ``tokenizer``
        (``tokenizer_digest``), by ``encoding``, which makes ``sequences`` of a record;
        ``local``: the worker's token directory (the entry's own is a subdirectory)."""
        identity = {
            "dataset": dataset.sha256,
            "tokenizer": tokenizer,
            "seq_len": str(seq_len),
            "encoding": encoding,
        }
        prefix = token_cache_prefix(
            dataset.tenant, dataset.sha256, tokenizer, seq_len, f"{encoding}-v{FORMAT_VERSION}"
        )
        entry = local / hashlib.sha256(prefix.encode()).hexdigest()[:32]
        return cls(store, prefix, entry, identity, writable, sequences)

    def layout(self) -> Layout | None:
        try:
            data = json.loads(self.store.get_bytes(join_key(self.prefix, TOKEN_LAYOUT)))
            return Layout(int(data["frames"]), str(data["cut"]))
        except NotFound:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("token cache %s: unreadable layout (%s); not using it", self.prefix, exc)
            return None

    def put_layout(self, layout: Layout) -> None:
        body = json.dumps({"frames": layout.frames, "cut": layout.cut, **self.identity})
        self._share(join_key(self.prefix, TOKEN_LAYOUT), body.encode())

    def get(self, frame: int) -> FrameTokens | None:
        identity = self._identity(frame)
        path = self._local(frame)
        try:
            local = path.read_bytes()
        except OSError:  # not there (or evicted meanwhile): the store's
            local = None
        if local is not None:
            try:
                tokens = decode_frame(local, identity, self.sequences)
                self.local_hits += 1
                return tokens
            except CorruptTokens:
                log.warning("token cache: local frame %s unusable; reading it again", path)
                path.unlink(missing_ok=True)
        try:
            data = self.store.get_bytes(token_frame_key(self.prefix, frame))
        except NotFound:
            return None
        self.bytes_read += len(data)
        try:
            tokens = decode_frame(data, identity, self.sequences)
        except CorruptTokens:
            # A bad entry costs a re-tokenization, never a wrong batch.
            log.warning(
                "token cache %s frame %d: unusable, tokenizing it again", self.prefix, frame
            )
            return None
        self.hits += 1
        self._keep(path, data)
        return tokens

    def put(self, frame: int, tokens: FrameTokens) -> None:
        if tokens.sequences != self.sequences:
            raise ValueError(
                f"records of {tokens.sequences} sequences in an entry of {self.sequences}"
            )
        data = encode_frame(tokens, self._identity(frame))
        self._keep(self._local(frame), data)
        self._share(token_frame_key(self.prefix, frame), data)

    def _identity(self, frame: int) -> dict[str, str]:
        return {**self.identity, "frame": str(frame)}

    def _local(self, frame: int) -> Path:
        return self.local / f"frame-{frame:06d}.safetensors.zst"

    @staticmethod
    def _keep(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError:
            # A local copy only saves a later read; an entry evicted meanwhile is no error.
            log.warning("token cache: could not keep %s", path, exc_info=True)
            tmp.unlink(missing_ok=True)

    def _share(self, key: str, data: bytes) -> None:
        if not self.writable:
            return
        try:
            self.store.put_bytes(key, data)
        except Exception:
            # The cache saves later runs work; failing to fill it must not fail this one.
            log.warning("token cache: could not write %s", key, exc_info=True)


def evict_entries(root: Path, max_bytes: int, keep: Path) -> list[Path]:
    """Remove the least recently used entry directories under ``root`` (never ``keep``, the
    caller's) until what is left takes at most ``max_bytes``; the ones removed."""
    if not root.is_dir():
        return []
    sizes: dict[Path, int] = {}
    for entry in root.iterdir():
        if entry.is_dir():
            sizes[entry] = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
    total = sum(sizes.values())
    removed = []
    for entry in sorted(sizes, key=lambda e: e.stat().st_mtime):
        if total <= max_bytes:
            break
        if entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)  # a run reading it reads the store instead
        total -= sizes[entry]
        removed.append(entry)
    return removed

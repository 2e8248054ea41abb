"""Reading model and adapter files in the object store without loading them.

Only safetensors are accepted: a pickle-based checkpoint can run arbitrary code when loaded,
and the registry hands these files to every trainer in the swarm.
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from swarm_contracts.layout import InvalidKey, join_key, validate_key
from swarm_contracts.memory import ModelShape
from swarm_registry.errors import RegistryError
from swarm_runtime.store import LocalStore, ObjectStore, S3Store, sha256_file, tree_digest

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
# Any one of these is enough for AutoTokenizer.from_pretrained to find a vocabulary.
TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model"}
)
# A safetensors header is a few KB per thousand tensors; anything near this is not one.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# safetensors dtype names of the float types a model's weights are loaded in.
FLOAT_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclass(frozen=True)
class ModelFiles:
    store_key: str
    files: dict[str, str]
    digest: str
    architecture: str
    parameter_count: int
    tokenizer: bool
    modules: tuple[str, ...] = ()
    shape: ModelShape | None = None


def normalize_prefix(store_key: str) -> str:
    try:
        return validate_key(store_key, prefix=True).rstrip("/")
    except InvalidKey as exc:
        raise RegistryError(str(exc)) from exc


def list_files(store: ObjectStore, prefix: str) -> list[str]:
    """Names relative to ``prefix``; an empty prefix is an error, not an empty artifact."""
    base = prefix + "/"
    names = [key[len(base) :] for key in store.list(base)]
    if not names:
        raise RegistryError(f"no files under store key {prefix!r}")
    return names


def reject_pickles(names: list[str]) -> None:
    pickles = sorted(n for n in names if PurePosixPath(n).suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise RegistryError(
            f"pickle-based files are not accepted (use safetensors): {', '.join(pickles)}"
        )


def read_prefix(store: ObjectStore, key: str, length: int) -> bytes:
    """The first ``length`` bytes of an object, without fetching the rest where avoidable."""
    if isinstance(store, LocalStore):
        with open(store.root / validate_key(key), "rb") as f:
            return f.read(length)
    if isinstance(store, S3Store):
        resp = store.client.get_object(store.bucket, validate_key(key), offset=0, length=length)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()
    return store.get_bytes(key)[:length]


def safetensors_header(store: ObjectStore, key: str) -> dict[str, Any]:
    """The JSON header of a safetensors file, read without its tensors.

    Layout: 8-byte little-endian header length, then that many bytes of JSON mapping tensor
    names to ``{"dtype", "shape", "data_offsets"}`` (plus an optional ``__metadata__``).
    """
    head = read_prefix(store, key, 8)
    if len(head) < 8:
        raise RegistryError(f"{key}: too short to be a safetensors file")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES:
        raise RegistryError(f"{key}: implausible safetensors header length {length}")
    raw = read_prefix(store, key, 8 + length)[8:]
    if len(raw) < length:
        raise RegistryError(f"{key}: truncated safetensors header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"{key}: invalid safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise RegistryError(f"{key}: invalid safetensors header: not a JSON object")
    return header


def tensor_elements(key: str, header: dict[str, Any]) -> Counter[str]:
    """Element counts by safetensors dtype of every tensor in a header."""
    counts: Counter[str] = Counter()
    try:
        for name, info in header.items():
            if name != "__metadata__":
                counts[str(info["dtype"])] += math.prod(int(d) for d in info["shape"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RegistryError(f"{key}: invalid safetensors header: {exc}") from exc
    return counts


def weight_modules(key: str, header: dict[str, Any]) -> set[str]:
    """The last name of every module with a 2-D ``weight`` (linear layers, embeddings): what a
    LoRA ``target_modules`` entry can name (``model.layers.0.self_attn.q_proj.weight`` ->
    ``q_proj``)."""
    try:
        return {
            name.removesuffix(".weight").rsplit(".", 1)[-1]
            for name, info in header.items()
            if name.endswith(".weight") and len(info["shape"]) == 2
        }
    except (TypeError, KeyError, AttributeError) as exc:
        raise RegistryError(f"{key}: invalid safetensors header: {exc}") from exc


def weights_dtype(elements: Counter[str]) -> str | None:
    """The float dtype most of the weights are stored in (what ``dtype="auto"`` falls back to
    when config.json names none)."""
    floats = [(n, FLOAT_DTYPES[d]) for d, n in elements.items() if d in FLOAT_DTYPES]
    return max(floats)[1] if floats else None


def load_config(config_bytes: bytes) -> dict[str, Any]:
    try:
        config = json.loads(config_bytes)
    except ValueError as exc:
        raise RegistryError(f"config.json is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise RegistryError("config.json must hold a JSON object")
    return config


def architecture_of(config_bytes: bytes) -> str:
    config = load_config(config_bytes)
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else "unknown"


def inspect_model(store: ObjectStore, store_key: str) -> ModelFiles:
    """Hash and inspect a HF ``from_pretrained`` directory (sync: call it in a thread)."""
    prefix = normalize_prefix(store_key)
    names = list_files(store, prefix)
    reject_pickles(names)
    if "config.json" not in names:
        raise RegistryError(f"no config.json under {prefix!r}")
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights:
        raise RegistryError(f"no .safetensors weights under {prefix!r}")
    files = {name: store.sha256(join_key(prefix, name)) for name in names}
    config_bytes = store.get_bytes(join_key(prefix, "config.json"))
    elements: Counter[str] = Counter()
    modules: set[str] = set()
    for name in weights:
        key = join_key(prefix, name)
        header = safetensors_header(store, key)
        elements.update(tensor_elements(key, header))
        modules |= weight_modules(key, header)
    parameter_count = sum(elements.values())
    return ModelFiles(
        store_key=prefix,
        files=files,
        digest=tree_digest(files),
        architecture=architecture_of(config_bytes),
        parameter_count=parameter_count,
        tokenizer=any(PurePosixPath(n).name in TOKENIZER_FILES for n in names),
        modules=tuple(sorted(modules)),
        # The numbers the memory estimate needs; None for a config that is no decoder's.
        shape=ModelShape.from_config(
            load_config(config_bytes), parameter_count, weights_dtype(elements)
        ),
    )


def check_source(store: ObjectStore, store_key: str) -> str:
    """The normalized prefix, if it holds files and no pickles (sync)."""
    prefix = normalize_prefix(store_key)
    reject_pickles(list_files(store, prefix))
    return prefix


def copy_tree(store: ObjectStore, source: str, target: str) -> dict[str, str]:
    """Copy every file under ``source`` to ``target``; return name -> sha256 of what was written.

    Each file passes through a local temp file so the hash is of the exact bytes uploaded and
    large adapters never sit in memory whole (sync: call it in a thread).
    """
    source = normalize_prefix(source)
    names = list_files(store, source)
    reject_pickles(names)
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="swarm-registry-") as tmp:
        for name in names:
            local = Path(tmp) / "file"
            store.get_file(join_key(source, name), local)
            files[name] = sha256_file(local)
            store.put_file(join_key(target, name), local)
            local.unlink()
    return files


def object_age_s(store: ObjectStore, key: str) -> float:
    """Seconds since an object was written; 0 when unknown, so that nothing young-looking is
    ever garbage-collected by mistake (sync)."""
    if isinstance(store, LocalStore):
        try:
            return max(0.0, time.time() - (store.root / validate_key(key)).stat().st_mtime)
        except FileNotFoundError:
            return 0.0
    if isinstance(store, S3Store):
        modified = store.client.stat_object(store.bucket, validate_key(key)).last_modified
        return max(0.0, time.time() - modified.timestamp()) if modified else 0.0
    return 0.0

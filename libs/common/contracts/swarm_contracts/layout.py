"""The object store's layout: every key Swarm writes, built and parsed in one place.

A contract like ``subjects``: the gateway uploads ``datasets/`` and ``models/``, the trainer
writes ``checkpoints/``, ``outputs/``, ``exports/``, the tokenized datasets of ``tokens/`` and
Tinker training sessions' saves (``tinker/``),
the registry copies adapters into ``adapters/`` and its garbage collector deletes what the
others wrote. Keys are '/'-separated
relative paths, validated so that no key can escape the store (docs/architecture.md, *Object
store keys*).
"""

from __future__ import annotations

import re
from typing import NamedTuple

DATASETS = "datasets"
MODELS = "models"
CHECKPOINTS = "checkpoints"
OUTPUTS = "outputs"
ADAPTERS = "adapters"
EXPORTS = "exports"
TOKENS = "tokens"
TINKER = "tinker"

# A run's outputs: the adapter it produced and its final metrics.
OUTPUT_ADAPTER = "adapter"
OUTPUT_RESULT = "result.json"
# What a replay (a verification job) measured, in place of an adapter and its result.
OUTPUT_REPLAY = "replay.json"
# Written last into an export's prefix: its ExportResult (every other file's sha256), what a
# download is checked against; an export without it is unfinished.
EXPORT_MANIFEST = "swarm-export.json"
# A token cache entry's first object: how many frames the dataset has and how it was cut into
# them, so that a job whose every frame is cached never reads the dataset itself.
TOKEN_LAYOUT = "layout.json"

_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class InvalidKey(ValueError):
    pass


def validate_key(key: str, *, prefix: bool = False) -> str:
    """Return ``key`` if it is a safe relative key; raise InvalidKey otherwise.

    A ``prefix`` may end with one '/' (a "directory"); a key may not.
    """
    if not isinstance(key, str) or not key or key.startswith("/") or _BAD_CHARS.search(key):
        raise InvalidKey(f"invalid store key {key!r}")
    body = key[:-1] if prefix and key.endswith("/") else key
    parts = body.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(f"invalid store key {key!r}")
    return key


def join_key(*parts: str) -> str:
    return validate_key("/".join(p.strip("/") for p in parts if p))


# --- Tinker training sessions (gateway, trainer) ---------------------------------------------


def session_saves(tenant: str, session: str | None = None) -> str:
    """A tenant's Tinker ``save_state`` saves; with ``session`` (its token), that model's
    (``<kind>/<name>`` below it). ``save_weights_for_sampler`` writes a job's output instead
    (``output_prefix(f"{session}-s{seq_id}", 1)``), which the registry takes adapters from."""
    return join_key(TINKER, tenant, session or "")


# --- uploads (gateway) ------------------------------------------------------------------------


def dataset_key(tenant: str, sha256: str) -> str:
    """An uploaded dataset, stored once per tenant and content (the sha256 of its JSONL),
    zstd-compressed. Datasets uploaded before compression sit at ``<sha256>.jsonl``, plain;
    their records keep that key, and readers tell the two apart by the magic bytes."""
    return join_key(DATASETS, tenant, f"{sha256}.jsonl.zst")


def model_prefix(name: str, tree_digest: str) -> str:
    """A base model in ``from_pretrained`` layout, content-addressed by its files' digest, so
    uploading the same files again stores nothing new."""
    return join_key(MODELS, name, tree_digest[:16])


# --- training (trainer) -----------------------------------------------------------------------


def tokens_of_dataset(tenant: str, sha256: str) -> str:
    """Every token cache entry of one of a tenant's datasets: what goes when the dataset goes."""
    return join_key(TOKENS, tenant, sha256)


def token_cache_prefix(
    tenant: str, sha256: str, tokenizer_digest: str, seq_len: int, encoding: str
) -> str:
    """One dataset tokenized one way: by the tokenizer whose files have ``tokenizer_digest``,
    truncated to ``seq_len``, by the ``encoding`` (the method's tokenizing function and the
    cache's format version). Its objects are the ``TOKEN_LAYOUT`` and one per frame; each is
    written whole (an object store put, or a rename), so a reader never sees half of one."""
    return join_key(
        tokens_of_dataset(tenant, sha256), f"{tokenizer_digest[:16]}-s{seq_len}-{encoding}"
    )


def token_frame_key(prefix: str, frame: int) -> str:
    return join_key(prefix, f"frame-{frame:06d}.safetensors.zst")


def job_checkpoints(job_id: str) -> str:
    """Ray Train's storage for a job: one run per attempt below it."""
    return join_key(CHECKPOINTS, job_id)


def run_name(attempt: int) -> str:
    return f"attempt-{attempt}"


def run_key(job_id: str, attempt: int) -> str:
    """Ray Train run storage of one attempt. One run per attempt: an attempt that lost its lease
    but wakes up (a frozen machine) can only checkpoint into, and prune, its own run."""
    return join_key(CHECKPOINTS, job_id, run_name(attempt))


# Committed checkpoints Ray Train keeps per run (older ones it deletes): a replay can start
# and end only at these.
CHECKPOINTS_KEPT = 2


def checkpoint_dir_name(step: int) -> str:
    """The directory a run's checkpoint of ``step`` is in (Ray Train's ``checkpoint_dir_name``)."""
    return f"checkpoint_{step:08d}"


def checkpoint_prefix(job_id: str, attempt: int, step: int) -> str:
    """One checkpoint directory of an attempt's run."""
    return join_key(run_key(job_id, attempt), checkpoint_dir_name(step))


def resume_key(job_id: str, attempt: int) -> str:
    """This attempt's own copy of the checkpoint it starts from, which no other run prunes."""
    return join_key(CHECKPOINTS, job_id, f"{run_name(attempt)}-resume")


def fork_key(job_id: str) -> str:
    """The checkpoint a job starts from when it forks another job's (``from_checkpoint``): the
    registry's copy, among the job's own checkpoints, so that it lives as long as the job."""
    return join_key(CHECKPOINTS, job_id, "fork")


# Ray Train v2 rewrites this file in a run's directory each time it registers a checkpoint
# (and before deleting old ones): a checkpoint directory it does not list was never committed.
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


def snapshot_key(job_id: str, attempt: int) -> str:
    return join_key(run_key(job_id, attempt), SNAPSHOT_FILE)


def committed_dir_names(snapshot: dict[str, object]) -> set[str]:
    """The checkpoint directories a run's snapshot (parsed JSON) lists as committed."""
    names: set[str] = set()
    latest = snapshot.get("latest_checkpoint_result")
    results = snapshot.get("checkpoint_results")
    for result in [latest, *(results if isinstance(results, list) else [])]:
        name = result.get("checkpoint_dir_name") if isinstance(result, dict) else None
        if isinstance(name, str) and name.startswith("checkpoint_"):
            names.add(name)
    return names


def output_prefix(job_id: str, attempt: int) -> str:
    """What one attempt produced, before the registry copies it."""
    return join_key(OUTPUTS, job_id, str(attempt))


def output_adapter(job_id: str, attempt: int) -> str:
    return join_key(output_prefix(job_id, attempt), OUTPUT_ADAPTER)


def output_result(job_id: str, attempt: int) -> str:
    return join_key(output_prefix(job_id, attempt), OUTPUT_RESULT)


def output_replay(job_id: str, attempt: int) -> str:
    return join_key(output_prefix(job_id, attempt), OUTPUT_REPLAY)


# --- registered artifacts (registry, export) ------------------------------------------------


def adapter_prefix(tenant: str, name: str, version: int) -> str:
    """A registered adapter in PEFT layout."""
    return join_key(ADAPTERS, tenant, name, str(version))


def export_prefix(tenant: str, name: str, version: int) -> str:
    """An adapter merged into its base model, ``from_pretrained`` layout."""
    return join_key(EXPORTS, tenant, name, str(version))


# --- parsing (the registry's garbage collector) -----------------------------------------------


class AdapterLocation(NamedTuple):
    prefix: str  # adapters/<tenant>/<name>/<version>
    name: str
    version: int | None  # None: not a number, i.e. not a key Swarm wrote


def parse_adapter_key(key: str) -> AdapterLocation | None:
    """Which registered adapter an ``adapters/…`` object belongs to (None: not one)."""
    parts = key.split("/")
    if len(parts) < 4 or parts[0] != ADAPTERS:
        return None
    version = int(parts[3]) if parts[3].isdigit() else None
    return AdapterLocation("/".join(parts[:4]), parts[2], version)


def dataset_of_tokens(key: str) -> tuple[str, str] | None:
    """(tenant, dataset sha256) of a ``tokens/…`` object (None: not one)."""
    parts = key.split("/")
    if len(parts) < 4 or parts[0] != TOKENS:
        return None
    return parts[1], parts[2]


def job_of(key: str) -> str | None:
    """The job an ``outputs/…`` or ``checkpoints/…`` object belongs to (None: neither)."""
    parts = key.split("/")
    if len(parts) < 2 or parts[0] not in (OUTPUTS, CHECKPOINTS):
        return None
    return parts[1]

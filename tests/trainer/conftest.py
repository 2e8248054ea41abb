"""Trainer fixtures: one tiny model per session, one local Ray cluster per session."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm_contracts.datasets import DatasetFormat, DatasetInfo, dataset_id_for
from swarm_contracts.jobs import JobSpec, ModelRef
from swarm_contracts.layout import DATASETS, dataset_key, join_key
from swarm_contracts.workers import Assignment
from swarm_runtime.dataset_codec import FRAME_BYTES, zstd_writer
from swarm_runtime.store import ObjectStore, tree_digest
from swarm_trainer import own_ray
from swarm_trainer.reports import Report
from swarm_trainer.tiny_model import create_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    # Ray start-up costs seconds: one cluster for the whole session.
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not ray.is_initialized():
        # 4 logical CPUs on 2 cores: an agent test lets go of a cancelled or superseded run
        # at once while Ray tears it down in the background, and a 2-worker test right after
        # must not wait 60 s for those CPUs (Ray Train's worker-group start timeout). Its own
        # Ray: never one another test or stack left on the host; started as an agent starts
        # its own, with no more processes than a trainer needs.
        own_ray.start(4, worker_logs=False)
    yield
    own_ray.stop()


def arithmetic_records(n: int = 48) -> list[dict[str, str]]:
    """A small, very learnable prompt/completion set."""
    return [
        {"prompt": f"Question: what is {i} plus {i}? Answer:", "completion": f" {2 * i}."}
        for i in range(n)
    ]


def preference_records(n: int = 48) -> list[dict[str, str]]:
    """The arithmetic set as preference pairs: the right sum over a wrong one."""
    return [
        {
            "prompt": f"Question: what is {i} plus {i}? Answer:",
            "chosen": f" {2 * i}.",
            "rejected": f" {2 * i + 1}.",
        }
        for i in range(n)
    ]


def put_dataset(
    store: ObjectStore,
    records: list[dict[str, Any]],
    tenant: str = "default",
    *,
    legacy_plain: bool = False,
    dataset_format: DatasetFormat = "prompt_completion",
    frame_bytes: int = FRAME_BYTES,
) -> DatasetInfo:
    """As the gateway stores it: seekable zstd at ``dataset_key`` (frames of ``frame_bytes``);
    ``legacy_plain``: as it did before compression, plain JSONL at ``<sha256>.jsonl``."""
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    sha = hashlib.sha256(data).hexdigest()
    if legacy_plain:
        key = join_key(DATASETS, tenant, f"{sha}.jsonl")
        store.put_bytes(key, data)
    else:
        key = dataset_key(tenant, sha)
        packed = io.BytesIO()
        with zstd_writer(packed, frame_bytes) as writer:
            writer.write(data)
        store.put_bytes(key, packed.getvalue())
    return DatasetInfo(
        id=dataset_id_for(sha),
        tenant=tenant,
        sha256=sha,
        store_key=key,
        format=dataset_format,
        examples=len(records),
        bytes=len(data),
    )


def put_model(store: ObjectStore, model_dir: Path) -> ModelRef:
    key = "models/tiny-llama/0000000000000000"
    files = store.upload_dir(model_dir, key)
    # As the registry records it: the worker's cache checks the files against it.
    return ModelRef(name="tiny-llama", version=1, store_key=key, digest=tree_digest(files))


def make_assignment(
    store: ObjectStore,
    model_dir: Path,
    *,
    job_id: str = "job-0123456789abcdef0123",
    worker_id: str = "w1",
    attempt: int = 1,
    training: dict[str, Any] | None = None,
    lora: dict[str, Any] | None = None,
    resources: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    frame_bytes: int = FRAME_BYTES,
) -> Assignment:
    """A job on the arithmetic set: prompt/completion examples, or with a DPO ``method`` the
    same prompts with the right sum chosen over a wrong one. ``frame_bytes``: the dataset's
    frames (small ones: a dataset of many frames, which the ranks shard by frame and stream
    across)."""
    dpo = method is not None and method.get("type") == "dpo"
    records = preference_records() if dpo else arithmetic_records()
    dataset = put_dataset(
        store,
        records,
        dataset_format="preference" if dpo else "prompt_completion",
        frame_bytes=frame_bytes,
    )
    spec = JobSpec.model_validate(
        {
            "method": method or {"type": "sft"},
            "name": "arith",
            "base_model": "tiny-llama",
            "dataset": dataset.id,
            "lora": {
                "r": 8,
                "alpha": 16,
                "dropout": 0.0,
                "target_modules": "all-linear",
                **(lora or {}),
            },
            "training": {
                "max_steps": 10,
                "batch_size": 8,
                "lr": 1e-2,
                "warmup_steps": 1,
                "seq_len": 64,
                "eval_every": 5,
                "checkpoint_every": 5,
                "val_fraction": 0.15,
                **(training or {}),
            },
            "resources": {"workers": 1, "cpus_per_worker": 1, **(resources or {})},
        }
    )
    return Assignment(
        job_id=job_id,
        attempt=attempt,
        tenant="default",
        worker_id=worker_id,
        spec=spec,
        base_model=put_model(store, model_dir),
        dataset=dataset,
    )


def drain(control: Any) -> list[Report]:
    """Everything rank 0 sent through the run's ``JobControl``, in order."""
    from swarm_trainer.control import drain as take

    return take(control, 0.0)

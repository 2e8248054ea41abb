"""Merged export: base model + a registered LoRA adapter folded into plain weights.

The result is a ``from_pretrained`` directory (config, safetensors weights, tokenizer) that
runs without peft, written to ``exports/<tenant>/<name>/<version>/``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import TypeVar

from faststream.nats import NatsBroker
from peft import PeftModel
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm_common.registry import (
    AdapterVersion,
    ExportAdapter,
    ExportResult,
    GetAdapter,
    GetModel,
    ModelVersion,
    Reply,
)
from swarm_common.store import ObjectStore, join_key
from swarm_common.subjects import Subjects

T = TypeVar("T", bound=BaseModel)


def export_key(tenant: str, name: str, version: int) -> str:
    return join_key("exports", tenant, name, str(version))


def merge_adapter(base_dir: Path, adapter_dir: Path, out_dir: Path) -> Path:
    """``merge_and_unload`` the adapter into the base weights; safetensors only, both ways."""
    base = AutoModelForCausalLM.from_pretrained(base_dir, use_safetensors=True)
    model = PeftModel.from_pretrained(base, adapter_dir, use_safetensors=True)
    merged = model.merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    if any(base_dir.glob("tokenizer*")):
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(out_dir)
    return out_dir


def export_merged(store: ObjectStore, base_key: str, adapter_key: str, out_key: str) -> str:
    """Download base and adapter, merge, upload under ``out_key``; returns ``out_key``."""
    work = Path(tempfile.mkdtemp(prefix="export-"))
    try:
        store.download_dir(base_key, work / "base")
        store.download_dir(adapter_key, work / "adapter")
        merge_adapter(work / "base", work / "adapter", work / "merged")
        store.upload_dir(work / "merged", out_key)
        return out_key
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def ask_registry(broker: NatsBroker, subject: str, request: BaseModel, result: type[T]) -> T:
    response = await broker.request(request, subject, timeout=10.0)
    reply = Reply[result].model_validate_json(response.body)  # type: ignore[valid-type]
    if not reply.ok or reply.result is None:
        raise LookupError(reply.error or "not found")
    return reply.result


async def export_registered(
    broker: NatsBroker, subjects: Subjects, store: ObjectStore, request: ExportAdapter
) -> ExportResult:
    """Merge a registered adapter (checked against its recorded digests) into its base model."""
    adapter = await ask_registry(
        broker,
        subjects.registry("adapters.get"),
        GetAdapter(name=request.name, version=request.version, tenant=request.tenant),
        AdapterVersion,
    )
    lineage = adapter.lineage
    model = await ask_registry(
        broker,
        subjects.registry("models.get"),
        GetModel(name=lineage.base_model, version=lineage.base_model_version),
        ModelVersion,
    )
    # Never merge bytes that are not the ones registered.
    stored = await asyncio.to_thread(store.file_digests, adapter.store_key)
    bad = sorted(n for n, sha in adapter.files.items() if stored.get(n) != sha)
    if bad:
        raise ValueError(f"adapter files do not match their registered sha256: {', '.join(bad)}")
    key = export_key(adapter.tenant, adapter.name, adapter.version)
    await asyncio.to_thread(export_merged, store, model.store_key, adapter.store_key, key)
    return ExportResult(
        store_key=key,
        files=await asyncio.to_thread(store.file_digests, key),
        adapter=f"{adapter.name}@{adapter.version}",
        base_model=f"{model.name}@{model.version}",
    )

"""Merged export: base model + a registered LoRA adapter folded into plain weights.

The result is a ``from_pretrained`` directory (config, safetensors weights, tokenizer) that
runs without peft, written to ``exports/<tenant>/<name>/<version>/``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm_contracts.layout import EXPORT_MANIFEST, export_prefix, join_key
from swarm_contracts.registry import (
    ExportAdapter,
    ExportResult,
    GetAdapter,
    GetModel,
)
from swarm_contracts.registry_api import GET_ADAPTER, GET_MODEL
from swarm_runtime.rpc import Refused, ServiceClient
from swarm_runtime.store import ObjectStore


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


async def export_registered(
    registry: ServiceClient, store: ObjectStore, request: ExportAdapter
) -> ExportResult:
    """Merge a registered adapter (checked against its recorded digests) into its base model.

    The registry's refusals (an unknown adapter: ``not_found``) reach the caller unchanged."""
    adapter = await registry.call(
        GET_ADAPTER,
        GetAdapter(name=request.name, version=request.version, tenant=request.tenant),
    )
    lineage = adapter.lineage
    model = await registry.call(
        GET_MODEL,
        GetModel(name=lineage.base_model, version=lineage.base_model_version),
    )
    # Never merge bytes that are not the ones registered.
    stored = await asyncio.to_thread(store.file_digests, adapter.store_key)
    bad = sorted(n for n, sha in adapter.files.items() if stored.get(n) != sha)
    if bad:
        raise Refused(
            f"adapter files do not match their registered sha256: {', '.join(bad)}", "internal"
        )
    key = export_prefix(adapter.tenant, adapter.name, adapter.version)
    manifest = join_key(key, EXPORT_MANIFEST)
    # A re-export: the old manifest goes first, so no download pairs it with new files.
    await asyncio.to_thread(store.delete, manifest)
    await asyncio.to_thread(export_merged, store, model.store_key, adapter.store_key, key)
    result = ExportResult(
        store_key=key,
        files=await asyncio.to_thread(store.file_digests, key),
        adapter=f"{adapter.name}@{adapter.version}",
        base_model=f"{model.name}@{model.version}",
    )
    await asyncio.to_thread(store.put_bytes, manifest, result.model_dump_json().encode())
    return result

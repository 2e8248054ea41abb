"""adapters.verify: stored files re-hashed against the sha256 recorded at registration."""

from __future__ import annotations

from typing import Any

from swarm_runtime.store import ObjectStore

from .test_adapters import register, upload_output


async def test_verify_reports_corrupted_and_missing_files(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    assert (await register(client, "bot", upload_output(store, "job-1", model_files), "job-1"))[
        "ok"
    ]
    clean = await client.call("adapters.verify", {"name": "bot", "version": 1})
    assert clean["result"] == {
        "name": "bot", "version": 1, "store_key": "adapters/acme/bot/1", "ok": True,
        "corrupted": [], "missing": [],
    }  # fmt: skip

    weights = "adapters/acme/bot/1/adapter_model.safetensors"
    data = bytearray(store.get_bytes(weights))
    data[-1] ^= 0xFF  # one flipped bit in the tensor data
    store.put_bytes(weights, bytes(data))
    store.delete("adapters/acme/bot/1/adapter_config.json")
    report = (await client.call("adapters.verify", {"name": "bot", "version": 1}))["result"]
    assert report["ok"] is False
    assert report["corrupted"] == ["adapter_model.safetensors"]
    assert report["missing"] == ["adapter_config.json"]

    hidden = await client.call("adapters.verify", {"name": "bot", "version": 1, "tenant": "z"})
    assert hidden["error"] == "unknown adapter 'bot' version 1"

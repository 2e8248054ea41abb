"""Base-model registration, driven over NATS against the real registry app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from swarm_contracts.registry import ModelVersion
from swarm_contracts.subjects import Subjects
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore
from swarm_runtime.topology import kv_bucket

# Fixtures come from conftest.py: ``client`` (a RegistryClient), ``model_files`` (ModelFiles).
CONFIG = json.dumps({"model_type": "llama"}).encode()


async def test_register_inspects_files_and_same_files_keep_version(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    model_files.upload("models/tiny/a")
    first = await client.call("models.register", {"name": "tiny", "store_key": "models/tiny/a"})
    assert first["ok"], first
    model = first["result"]
    assert model["version"] == 1
    assert model["architecture"] == "LlamaForCausalLM"
    assert model["parameter_count"] == 15
    assert model["tokenizer"] is True
    assert set(model["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert model["files"]["config.json"] == store.sha256("models/tiny/a/config.json")

    # The same bytes under another key are the same model: no new version.
    model_files.upload("models/tiny/b")
    again = await client.call("models.register", {"name": "tiny", "store_key": "models/tiny/b/"})
    assert again["result"]["version"] == 1
    assert again["result"]["digest"] == model["digest"]

    weights = model_files.safetensors({"w": [8, 8]})
    model_files.upload("models/tiny/c", {"model.safetensors": weights})
    changed = await client.call("models.register", {"name": "tiny", "store_key": "models/tiny/c"})
    assert changed["result"]["version"] == 2
    assert changed["result"]["parameter_count"] == 64
    assert changed["result"]["tokenizer"] is True

    latest = await client.call("models.get", {"name": "tiny"})
    assert latest["result"]["version"] == 2
    pinned = await client.call("models.get", {"name": "tiny", "version": 1})
    assert pinned["result"]["digest"] == model["digest"]
    listed = await client.call("models.list")
    assert [(m["name"], m["version"]) for m in listed["result"]] == [("tiny", 1), ("tiny", 2)]


async def test_rejects_pickles_and_incomplete_dirs(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    model_files.upload("models/bad/p", {"pytorch_model.bin": b"\x80\x04pickle"})
    reply = await client.call("models.register", {"name": "bad", "store_key": "models/bad/p"})
    assert not reply["ok"]
    assert "pytorch_model.bin" in reply["error"]

    store.put_bytes("models/bad/nocfg/model.safetensors", model_files.safetensors({"w": [2]}))
    reply = await client.call("models.register", {"name": "bad", "store_key": "models/bad/nocfg"})
    assert not reply["ok"]
    assert "config.json" in reply["error"]

    store.put_bytes("models/bad/noweights/config.json", CONFIG)
    reply = await client.call(
        "models.register", {"name": "bad", "store_key": "models/bad/noweights"}
    )
    assert not reply["ok"]
    assert ".safetensors" in reply["error"]

    reply = await client.call("models.register", {"name": "bad", "store_key": "models/none"})
    assert not reply["ok"]
    assert "no files" in reply["error"]
    reply = await client.call("models.register", {"name": "bad", "store_key": "../etc"})
    assert not reply["ok"]
    assert "invalid" in reply["error"]
    reply = await client.call("models.register", {"name": "Bad.Name", "store_key": "models/x"})
    assert not reply["ok"]
    assert "invalid model name" in reply["error"]
    assert reply["code"] == "invalid"

    missing = await client.call("models.get", {"name": "bad"})
    assert missing == {
        "ok": False,
        "error": "unknown model 'bad'",
        "code": "not_found",
        "result": None,
    }


async def test_concurrent_registrations_of_different_files_get_distinct_versions(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    for i in range(4):
        weights = model_files.safetensors({"w": [i + 1]})
        model_files.upload(f"models/race/{i}", {"model.safetensors": weights})
    replies = await asyncio.gather(
        *(
            client.call("models.register", {"name": "race", "store_key": f"models/race/{i}"})
            for i in range(4)
        )
    )
    assert all(r["ok"] for r in replies), replies
    assert sorted(r["result"]["version"] for r in replies) == [1, 2, 3, 4]


async def test_a_malformed_request_is_answered_and_dead_lettered(
    client: Any, settings: Settings
) -> None:
    subjects = Subjects(settings.namespace)
    reply = await client.nc.request(subjects.registry("models.get"), b'{"nme": 1}', timeout=5)
    body = json.loads(reply.data)
    assert body["ok"] is False
    assert "name" in body["error"]
    sub = await client.nc.jetstream().subscribe(
        subjects.dead_letter("registry"), ordered_consumer=True
    )
    parked = await sub.next_msg(timeout=5)
    assert parked.data == b'{"nme": 1}'
    # The registry still serves well-formed requests.
    reply = await client.nc.request(subjects.registry("models.list"), b"{}", timeout=5)
    assert json.loads(reply.data)["ok"] is True


async def test_a_name_that_is_no_key_is_refused_as_invalid_not_an_error(client: Any) -> None:
    # The Tinker API passes on names its callers typed: "" or "Qwen/Qwen3-8B" is no KV key.
    for name in ("", "Qwen/Qwen3-8B", "a b"):
        reply = await client.call("models.get", {"name": name})
        assert reply["ok"] is False
        assert reply["code"] == "invalid", reply
        assert "model name" in reply["error"]


async def test_files_of_an_older_version_are_that_version(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    model_files.upload("models/ab/1")
    model_files.upload("models/ab/2", {"model.safetensors": model_files.safetensors({"w": [5]})})
    first = await client.call("models.register", {"name": "ab", "store_key": "models/ab/1"})
    second = await client.call("models.register", {"name": "ab", "store_key": "models/ab/2"})
    assert (first["result"]["version"], second["result"]["version"]) == (1, 2)
    # v1's files once more, after v2: still v1, and no v3.
    model_files.upload("models/ab/3")
    again = await client.call("models.register", {"name": "ab", "store_key": "models/ab/3"})
    assert again["result"]["version"] == 1
    listed = await client.call("models.list")
    assert [m["version"] for m in listed["result"]] == [1, 2]
    # Every file's sha256 is recorded, and matches the stored bytes.
    for name, digest in second["result"]["files"].items():
        assert store.sha256(f"models/ab/2/{name}") == digest


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "vocab_size": 512,
}


async def test_register_keeps_the_architecture_numbers_for_memory_estimates(
    client: Any, model_files: Any
) -> None:
    config = json.dumps(LLAMA_CONFIG).encode()
    model_files.upload("models/llama/a", {"config.json": config})
    reply = await client.call("models.register", {"name": "llama", "store_key": "models/llama/a"})
    assert reply["ok"], reply
    assert reply["result"]["shape"] == {
        "hidden_size": 64,
        "num_layers": 3,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "intermediate_size": 176,
        "vocab_size": 512,
        "parameter_count": 15,
        # config.json names no dtype: the weights' own (F32 in these files).
        "dtype": "float32",
    }
    bf16 = json.dumps({**LLAMA_CONFIG, "dtype": "bfloat16"}).encode()
    model_files.upload("models/llama/b", {"config.json": bf16})
    reply = await client.call("models.register", {"name": "llama", "store_key": "models/llama/b"})
    assert reply["result"]["shape"]["dtype"] == "bfloat16"

    # A config that is no decoder's (no layer count, no MLP width) has no shape.
    model_files.upload("models/enc/a")
    reply = await client.call("models.register", {"name": "enc", "store_key": "models/enc/a"})
    assert reply["ok"]
    assert reply["result"]["shape"] is None


async def test_registering_the_same_files_again_fills_in_a_missing_shape(
    client: Any, model_files: Any, settings: Settings
) -> None:
    config = json.dumps(LLAMA_CONFIG).encode()
    model_files.upload("models/old/a", {"config.json": config})
    first = await client.call("models.register", {"name": "old", "store_key": "models/old/a"})
    # As a registry from before shapes were kept wrote it.
    js = client.nc.jetstream()
    table = RecordTable(await kv_bucket(js, Subjects(settings.namespace), "models"), ModelVersion)
    old = ModelVersion.model_validate({**first["result"], "shape": None})
    await table.put("old.1", old)
    assert (await client.call("models.get", {"name": "old"}))["result"]["shape"] is None

    again = await client.call("models.register", {"name": "old", "store_key": "models/old/a"})
    assert again["result"]["version"] == 1
    assert again["result"]["shape"]["hidden_size"] == 64
    assert (await client.call("models.get", {"name": "old"}))["result"]["shape"] is not None

"""Lineage: parent chains, base-model filters, and the graph request."""

from __future__ import annotations

from typing import Any

from swarm_runtime.store import ObjectStore

from .test_adapters import register, upload_output


async def test_lineage_graph_follows_parents(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    async def add(name: str, job: str, **kw: Any) -> dict:
        reply = await register(client, name, upload_output(store, job, model_files), job, **kw)
        assert reply["ok"], reply
        return reply["result"]

    await add("base", "job-1", validation_dataset="ds-" + "c" * 24, validation_digest="d" * 64)
    await add("tuned", "job-2", parent="base@1", base_model="tiny", base_model_version=2)
    await add("tuned", "job-3", parent="tuned@1", tenant="acme", worker_ids=["w1", "w2"])
    await add("other", "job-4", tenant="zeta", base_model="big")
    await add("stray", "job-5", parent="other@1")  # a parent of another tenant

    graph = (await client.call("adapters.lineage", {"name": "tuned", "version": 2}))["result"]
    assert graph["root"] == "tuned@2"
    assert [n["ref"] for n in graph["adapters"]] == ["tuned@2", "tuned@1", "base@1"]
    assert [n["base_model"] for n in graph["adapters"]] == ["tiny@1", "tiny@2", "tiny@1"]
    assert graph["adapters"][2]["validation_digest"] == "d" * 64
    assert graph["unresolved"] == []
    edges = {(e["source"], e["kind"], e["target"]) for e in graph["edges"]}
    assert ("tuned@2", "parent", "tuned@1") in edges
    assert ("tuned@1", "parent", "base@1") in edges
    assert ("tuned@1", "base_model", "tiny@2") in edges
    assert ("base@1", "validation", "ds-" + "c" * 24) in edges
    record = await client.call("adapters.get", {"name": "tuned", "version": 2})
    assert record["result"]["lineage"]["worker_ids"] == ["w1", "w2"]

    scoped = await client.call(
        "adapters.lineage", {"name": "stray", "version": 1, "tenant": "acme"}
    )
    assert [n["ref"] for n in scoped["result"]["adapters"]] == ["stray@1"]
    assert scoped["result"]["unresolved"] == ["other@1"]

    bad = await register(client, "x", upload_output(store, "job-6", model_files), "job-6",
                         parent="base@production")  # fmt: skip
    assert not bad["ok"]
    assert "name@version" in bad["error"]


async def test_list_by_base_model(client: Any, store: ObjectStore, model_files: Any) -> None:
    for job, model, version in (("job-1", "tiny", 1), ("job-2", "tiny", 2), ("job-3", "big", 1)):
        key = upload_output(store, job, model_files)
        reply = await register(
            client, "bot", key, job, base_model=model, base_model_version=version
        )
        assert reply["ok"], reply

    async def versions(**query: Any) -> list[int]:
        reply = await client.call("adapters.list", query)
        return [a["version"] for a in reply["result"]]

    assert await versions(base_model="tiny") == [1, 2]
    assert await versions(base_model="tiny@2") == [2]
    assert await versions(base_model="big", name="bot") == [3]
    assert await versions(base_model="big", tenant="zeta") == []

"""Aliases: set, move, get by alias or ref, per tenant; promotion rules and their event."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore

from .test_adapters import register, upload_output


async def add(client: Any, store: ObjectStore, model_files: Any, job: str, **kw: Any) -> int:
    reply = await register(client, "bot", upload_output(store, job, model_files), job, **kw)
    assert reply["ok"], reply
    return reply["result"]["version"]


async def test_set_move_and_get_by_alias(client: Any, store: ObjectStore, model_files: Any) -> None:
    v1 = await add(client, store, model_files, "job-1")
    v2 = await add(client, store, model_files, "job-2")
    first = await client.call(
        "adapters.alias.set", {"name": "bot", "alias": "production", "version": v1}
    )
    assert first["result"] == {
        "name": "bot", "tenant": "acme", "alias": "production", "version": v1,
        "previous_version": None,
    }  # fmt: skip
    moved = await client.call(
        "adapters.alias.set",
        {"name": "bot", "alias": "production", "version": v2, "tenant": "acme"},
    )
    assert (moved["result"]["version"], moved["result"]["previous_version"]) == (v2, v1)

    by_alias = await client.call("adapters.get", {"name": "bot", "alias": "production"})
    assert by_alias["result"]["version"] == v2
    # The ref forms the scheduler resolves for `from_adapter`.
    assert (await client.call("adapters.get", {"name": "bot@production"}))["result"]["version"] == 2
    assert (await client.call("adapters.get", {"name": "bot@1"}))["result"]["version"] == 1

    # Another tenant neither sees nor moves acme's alias.
    other = await client.call(
        "adapters.get", {"name": "bot", "alias": "production", "tenant": "zeta"}
    )
    assert other["error"] == "unknown adapter 'bot' alias 'production'"
    hijack = await client.call(
        "adapters.alias.set", {"name": "bot", "alias": "production", "version": 1, "tenant": "zeta"}
    )
    assert not hijack["ok"]
    assert hijack["error"].startswith("unknown adapter")

    bad = await client.call("adapters.alias.set", {"name": "bot", "alias": "Prod!", "version": 1})
    assert not bad["ok"]
    assert "invalid alias" in bad["error"]
    missing = await client.call("adapters.alias.set", {"name": "bot", "alias": "x", "version": 9})
    assert missing["error"] == "unknown adapter 'bot' version 9"


async def test_rule_promotes_improving_versions_and_announces(
    client: Any, store: ObjectStore, model_files: Any, settings: Settings
) -> None:
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    events = await nc.jetstream().subscribe(
        subjects.adapter_promoted("bot"), stream=subjects.adapters_stream, ordered_consumer=True
    )
    rule = {"name": "bot", "alias": "candidate", "metric": "eval_loss", "mode": "min"}
    assert (await client.call("adapters.rule.set", {**rule, "tenant": "acme"}))["ok"]
    no_tenant = await client.call("adapters.rule.set", rule)
    assert not no_tenant["ok"]
    assert "tenant" in no_tenant["error"]

    await add(client, store, model_files, "job-1", metrics={"eval_loss": 2.0})
    await add(client, store, model_files, "job-2", metrics={"eval_loss": 2.5})  # worse
    await add(client, store, model_files, "job-3", metrics={"eval_loss": 1.0})  # better
    await add(client, store, model_files, "job-4", metrics={"train_loss": 0.1})  # no eval_loss
    # Another tenant's better version does not touch acme's alias.
    await add(client, store, model_files, "job-5", tenant="zeta", metrics={"eval_loss": 0.1})

    holder = await client.call("adapters.get", {"name": "bot@candidate", "tenant": "acme"})
    assert holder["result"]["version"] == 3

    seen = [json.loads((await events.next_msg(timeout=5)).data) for _ in range(2)]
    assert [e["type"] for e in seen] == ["swarm.adapter.promoted"] * 2
    data = [e["data"] for e in seen]
    assert [(d["version"], d["previous_version"]) for d in data] == [(1, None), (3, 1)]
    assert data[1]["metrics"] == {"eval_loss": 1.0}
    assert data[1]["previous_metrics"] == {"eval_loss": 2.0}
    assert data[1]["rule"]["metric"] == "eval_loss"
    assert data[1]["alias"] == "candidate"
    assert data[1]["tenant"] == "acme"
    try:
        extra = await events.next_msg(timeout=0.5)
        raise AssertionError(f"unexpected promotion {extra.data!r}")
    except nats.errors.TimeoutError:
        pass
    await nc.close()


async def test_racing_registrations_promote_the_best(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    rule = {"name": "bot", "alias": "best", "metric": "accuracy", "mode": "max", "tenant": "acme"}
    assert (await client.call("adapters.rule.set", rule))["ok"]
    scores = [0.3, 0.9, 0.5, 0.7, 0.1, 0.8]
    versions = await asyncio.gather(
        *(
            add(client, store, model_files, f"job-r{i}", metrics={"accuracy": s})
            for i, s in enumerate(scores)
        )
    )
    best = versions[scores.index(max(scores))]
    holder = await client.call("adapters.get", {"name": "bot", "alias": "best"})
    assert holder["result"]["version"] == best


async def test_a_rule_on_a_task_metric_promotes_only_versions_that_reach_its_threshold(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    rule = {
        "name": "bot",
        "alias": "production",
        "metric": "exact_match",
        "mode": "max",
        "threshold": 0.9,
        "tenant": "acme",
    }
    assert (await client.call("adapters.rule.set", rule))["ok"]
    below = await add(client, store, model_files, "job-t1", metrics={"exact_match": 0.85})
    missing = await client.call("adapters.get", {"name": "bot", "alias": "production"})
    assert not missing["ok"], f"v{below} at 0.85 must not be promoted"
    reached = await add(client, store, model_files, "job-t2", metrics={"exact_match": 0.9})
    await add(client, store, model_files, "job-t3", metrics={"exact_match": 0.88})
    holder = await client.call("adapters.get", {"name": "bot", "alias": "production"})
    assert holder["result"]["version"] == reached
    best = await add(client, store, model_files, "job-t4", metrics={"exact_match": 0.97})
    holder = await client.call("adapters.get", {"name": "bot", "alias": "production"})
    assert holder["result"]["version"] == best

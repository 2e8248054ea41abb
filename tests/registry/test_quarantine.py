"""Quarantine: a version whose job failed its verification is not served, aliased, continued
from or the latest, until an admin clears it; a rerun of the job makes a new version."""

from __future__ import annotations

from typing import Any

from swarm_runtime.store import ObjectStore

from .test_adapters import register, upload_output


async def test_a_quarantined_version_is_shown_but_not_used_until_cleared(
    client: Any, store: ObjectStore, model_files: Any
) -> None:
    for job in ("job-q1", "job-q2"):
        assert (await register(client, "bot", upload_output(store, job, model_files), job))["ok"]
    moved = await client.call("adapters.alias.set", {"name": "bot", "alias": "prod", "version": 2})
    assert moved["ok"], moved

    reason = "steps 4→6: q.lora_B is 0.9 away (relative L2)"
    quarantined = await client.call("adapters.quarantine", {"job_id": "job-q2", "reason": reason})
    assert quarantined["ok"], quarantined
    assert quarantined["result"]["version"] == 2
    assert quarantined["result"]["quarantine"]["reason"] == reason
    # Asked again (a redelivered verdict): the same.
    again = await client.call("adapters.quarantine", {"job_id": "job-q2", "reason": reason})
    assert again["result"]["quarantine"] == quarantined["result"]["quarantine"]

    # Not the latest, not servable by version or alias, not aliasable...
    latest = await client.call("adapters.get", {"name": "bot"})
    assert latest["result"]["version"] == 1
    by_version = await client.call("adapters.get", {"name": "bot", "version": 2})
    assert (by_version["ok"], by_version["code"]) == (False, "conflict")
    assert "quarantined" in by_version["error"]
    assert "unquarantine" in by_version["error"]
    by_alias = await client.call("adapters.get", {"name": "bot@prod"})
    assert by_alias["code"] == "conflict"
    realias = await client.call("adapters.alias.set", {"name": "bot", "alias": "stg", "version": 2})
    assert realias["code"] == "conflict"
    # ...but shown as such.
    shown = await client.call(
        "adapters.get", {"name": "bot", "version": 2, "include_quarantined": True}
    )
    assert shown["result"]["quarantine"]["job_id"] == "job-q2"
    listed = {a["version"]: a["quarantine"] for a in (await client.call("adapters.list"))["result"]}
    assert listed[1] is None
    assert listed[2]["reason"] == reason

    # The job, rerun (its next attempt), makes a new version rather than get the old one back.
    rerun_key = upload_output(store, "job-q2", model_files, seed=5, attempt=2)
    rerun = await register(client, "bot", rerun_key, "job-q2", attempt=2)
    assert rerun["ok"], rerun
    assert rerun["result"]["version"] == 3
    assert rerun["result"]["quarantine"] is None
    assert (await client.call("adapters.get", {"name": "bot"}))["result"]["version"] == 3

    cleared = await client.call("adapters.unquarantine", {"name": "bot", "version": 2})
    assert cleared["ok"], cleared
    assert cleared["result"]["quarantine"] is None
    assert (await client.call("adapters.get", {"name": "bot", "version": 2}))["ok"]
    assert (await client.call("adapters.get", {"name": "bot@prod"}))["result"]["version"] == 2

    unknown = await client.call("adapters.quarantine", {"job_id": "job-none", "reason": "x"})
    assert unknown["code"] == "not_found"

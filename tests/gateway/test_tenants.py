"""Tenants against the real stack: hashed keys, isolation of jobs/events/datasets, admins."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from swarm import AsyncClient, AuthError, NotFoundError
from swarm_gateway.auth import hash_key, parse_api_keys

from ..conftest import ServerThread
from ..scheduler.conftest import write_fake_model
from .conftest import ADMIN, ALICE, BOB


def test_only_hashes_are_kept_and_malformed_entries_fail() -> None:
    table = parse_api_keys(f"plain=alice,{hash_key('secret')}=bob,x=admin", "root")
    assert table.lookup("plain").tenant == "alice"  # type: ignore[union-attr]
    bob = table.lookup("secret")
    assert bob is not None
    assert bob.tenant == "bob"
    assert not bob.admin
    assert table.lookup(hash_key("secret")) is None  # the hash itself is not a key
    assert table.lookup("x").admin
    assert table.lookup("root").admin
    assert "plain" not in repr(table)
    assert "secret" not in repr(table)
    with pytest.raises(ValueError, match="not 'key=tenant'"):
        parse_api_keys("no-tenant")
    with pytest.raises(ValueError, match="tenant"):
        parse_api_keys("k=Bad Tenant")


async def _setup(url: str, tmp_path: Path) -> str:
    """A registered model (as admin) and the dataset text every tenant uploads."""
    write_fake_model(tmp_path / "model")
    async with AsyncClient(url, api_key=ADMIN) as admin:
        await admin.add_model("tiny", tmp_path / "model")
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
    return str(path)


async def _tenant_run(url: str, key: str, data: str, n: int) -> tuple[str, list[str]]:
    async with AsyncClient(url, api_key=key) as c:
        ds = (await c.upload_dataset(data)).id
        spec = {"name": "bot", "base_model": "tiny", "dataset": ds}
        jobs = await asyncio.gather(
            *(c.submit(spec, idempotency_key=f"{key}-{i}") for i in range(n))
        )
        return ds, [j.job_id for j in jobs]


async def test_two_tenants_concurrently_see_only_their_own(
    tenant_stack: ServerThread, tmp_path: Path
) -> None:
    url = tenant_stack.url
    data = await _setup(url, tmp_path)
    (ds_a, jobs_a), (ds_b, jobs_b) = await asyncio.gather(
        _tenant_run(url, ALICE, data, 3), _tenant_run(url, BOB, data, 2)
    )
    # Same bytes, same content address, but each tenant owns its own record.
    assert ds_a == ds_b

    async with (
        AsyncClient(url, api_key=ALICE) as alice,
        AsyncClient(url, api_key=BOB) as bob,
        AsyncClient(url, api_key=ADMIN) as admin,
    ):
        for me, mine, theirs in ((alice, jobs_a, jobs_b), (bob, jobs_b, jobs_a)):
            listed, _ = await me.list_jobs(limit=100)
            assert sorted(j.job_id for j in listed) == sorted(mine)
            # Asking for everything still only gets one's own: `tenant` is for admins.
            listed, _ = await me.list_jobs(limit=100, tenant="alice")
            assert sorted(j.job_id for j in listed) == sorted(mine)
            for job_id in theirs:
                with pytest.raises(NotFoundError):
                    await me.get_job(job_id)
                with pytest.raises(NotFoundError):
                    await me.cancel(job_id)
                with pytest.raises(NotFoundError):
                    await anext(me.events(job_id))
            # The real scheduler queued each job; its owner replays the queued event.
            record = await me.get_job(mine[0])
            assert record.state == "queued"
            first = await anext(me.events(mine[0]))
            assert first.event == "queued"
            assert first.payload["job_id"] == mine[0]
            assert [d.id for d in await me.list_datasets()] == [ds_a]
        with pytest.raises(AuthError) as denied:
            await alice.workers()
        assert denied.value.status_code == 403
        # The base-model catalog is shared: a tenant may use it but not add to it.
        with pytest.raises(AuthError) as not_admin:
            await alice.add_model("tiny", tmp_path / "model")
        assert not_admin.value.status_code == 403
        assert [(m.name, m.version) for m in await alice.list_models()] == [("tiny", 1)]

        everyone, _ = await admin.list_jobs(limit=100)
        assert sorted(j.job_id for j in everyone) == sorted(jobs_a + jobs_b)
        only_bob, _ = await admin.list_jobs(limit=100, tenant="bob")
        assert sorted(j.job_id for j in only_bob) == sorted(jobs_b)
        assert (await admin.get_job(jobs_a[0])).tenant == "alice"
        assert await admin.workers() == []
    async with AsyncClient(url, api_key="not-a-key") as stranger:
        with pytest.raises(AuthError) as unknown:
            await stranger.list_jobs()
        assert unknown.value.status_code == 401

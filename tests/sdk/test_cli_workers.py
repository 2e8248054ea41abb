"""`swarm workers cordon|uncordon|drain|clear` through the SDK and a real gateway: what they
write to the ``worker_ops`` bucket (which the scheduler follows:
tests/scheduler/test_worker_ops.py) and how `swarm workers` shows it."""

from __future__ import annotations

import json
from unittest.mock import patch

import httpx
import nats
from rich.console import Console
from typer.testing import CliRunner

from swarm.cli import app
from swarm.cli.output import out
from swarm_contracts.jobs import utcnow
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Resources, WorkerInfo, WorkerOps
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

runner = CliRunner()


def cli(gateway_url: str, *args: str) -> tuple[int, str]:
    # A wide console whatever the terminal (none, under pytest-xdist): no wrapped cells.
    with patch.object(out, "console", Console(width=200)):
        result = runner.invoke(app, ["--url", gateway_url, *args])
    return result.exit_code, result.output


async def test_cordon_drain_and_uncordon_a_worker(gateway, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    nc = await nats.connect(settings.nats_url)
    js, subjects = nc.jetstream(), Subjects(settings.namespace)
    workers = RecordTable(await kv_bucket(js, subjects, "workers"), WorkerInfo)
    ops = RecordTable(await kv_bucket(js, subjects, "worker_ops"), WorkerOps)
    res = Resources(cpus=2, memory_bytes=1 << 30)
    info = WorkerInfo(
        worker_id="w1", state="alive", resources=res, free=res, last_heartbeat=utcnow()
    )
    await workers.put("w1", info)
    try:
        code, out = cli(gateway.url, "workers", "cordon", "w1", "--reason", "disk swap")
        assert code == 0, out
        found = await ops.get("w1")
        assert found is not None
        assert found[0].cordoned
        assert found[0].reason == "disk swap"
        code, out = cli(gateway.url, "workers", "--json")
        [listed] = json.loads(out)
        assert (listed["cordoned"], listed["draining"]) == (True, False)
        assert "alive, cordoned" in cli(gateway.url, "workers")[1]

        code, out = cli(gateway.url, "workers", "drain", "w1", "--move")
        assert code == 0, out
        found = await ops.get("w1")
        assert found is not None
        assert found[0].drain
        assert found[0].move_jobs
        assert "alive, drained" in cli(gateway.url, "workers")[1]  # it runs nothing

        code, out = cli(gateway.url, "workers", "uncordon", "w1")
        assert code == 0, out
        assert await ops.get("w1") is None
        [listed] = json.loads(cli(gateway.url, "workers", "--json")[1])
        assert (listed["cordoned"], listed["draining"]) == (False, False)

        # A verification caught it: suspect until cleared, whatever uncordon says.
        await ops.put("w1", WorkerOps(worker_id="w1", suspect=True, suspect_reason="replay"))
        [listed] = json.loads(cli(gateway.url, "workers", "--json")[1])
        assert (listed["suspect"], listed["cordoned"]) == (True, True)
        assert "alive, suspect" in cli(gateway.url, "workers")[1]
        assert cli(gateway.url, "workers", "cordon", "w1")[0] == 0
        assert cli(gateway.url, "workers", "uncordon", "w1")[0] == 0
        found = await ops.get("w1")
        assert found is not None
        assert (found[0].suspect, found[0].cordoned) == (True, False)
        code, out = cli(gateway.url, "workers", "clear", "w1")
        assert code == 0, out
        assert "cleared" in out
        assert await ops.get("w1") is None

        # A typo names no worker: refused rather than a cordon nobody will ever match.
        code, out = cli(gateway.url, "workers", "drain", "w2")
        assert code == 2
        assert "not found" in out
        assert await ops.get("w2") is None
        async with httpx.AsyncClient() as http:
            bad = await http.post(f"{gateway.url}/v1/workers/a.b/cordon")
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["path", "worker_id"]
    finally:
        await nc.close()

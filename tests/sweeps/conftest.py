"""The sweeps service with the real registry and scheduler in-process and a live gateway, but
no trainer: trials are queued jobs that never run (enough for everything but training)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from swarm import AsyncClient
from swarm_runtime.settings import Settings

from ..conftest import ServerThread
from ..scheduler.conftest import write_fake_model

ALICE, BOB, ADMIN = "key-alice", "key-bob", "key-admin"


@dataclass
class ControlStack:
    url: str
    settings: Settings
    dataset: str  # alice's


@pytest.fixture
async def control_stack(settings: Settings, tmp_path: Path) -> AsyncIterator[ControlStack]:
    from swarm_gateway import create_app
    from swarm_gateway.settings import GatewaySettings
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_sweeps.app import build_app as build_sweeps

    keyed = GatewaySettings.of(settings, api_keys=f"{ALICE}=alice,{BOB}=bob", admin_keys=ADMIN)
    async with build_registry(keyed), build_scheduler(keyed), build_sweeps(keyed):
        with ServerThread(create_app(keyed, submit_wait_s=5.0, request_timeout_s=5.0)) as gw:
            write_fake_model(tmp_path / "model")
            data = tmp_path / "data.jsonl"
            data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
            async with AsyncClient(gw.url, api_key=ADMIN) as admin:
                await admin.add_model("tiny", tmp_path / "model")
            async with AsyncClient(gw.url, api_key=ALICE) as alice:
                dataset = (await alice.upload_dataset(data)).id
            yield ControlStack(url=gw.url, settings=keyed, dataset=dataset)

"""The registry's /metrics, scraped over HTTP around a real adapter registration."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import nats
import pytest

from swarm_contracts.subjects import Subjects
from swarm_registry import build_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore

from ..conftest import sample, scrape
from .conftest import RegistryClient
from .test_adapters import register, upload_output


async def test_versions_registered_and_requests_are_counted(
    settings: Settings, store: ObjectStore, model_files: Any
) -> None:
    settings = settings.model_copy(update={"metrics_port": 0})
    app = build_app(settings)
    nc = await nats.connect(settings.nats_url)
    client = RegistryClient(nc, Subjects(settings.namespace))
    try:
        async with app:
            port = app.context.get("metrics_server").port
            before = await asyncio.to_thread(scrape, port)
            assert sample(before, "swarm_registry_adapter_versions_registered_total") == 0

            key = upload_output(store, "job-m1", model_files)
            assert (await register(client, "bot", key, "job-m1"))["ok"]
            # The same job again is the same version: not a new one.
            assert (await register(client, "bot", key, "job-m1"))["ok"]
            assert (await client.call("adapters.get", {"name": "bot"}))["ok"]

            after = await asyncio.to_thread(scrape, port)
            assert sample(after, "swarm_registry_adapter_versions_registered_total") == 1
            subject = client.subjects.registry("adapters.register")
            assert sample(after, "swarm_registry_received_messages_total", handler=subject) == 2
            durations = "swarm_registry_received_processed_messages_duration_seconds"
            assert sample(after, f"{durations}_count", handler=subject) == 2
            assert sample(after, f"{durations}_sum", handler=subject) > 0
    finally:
        await nc.close()
    # The server stops with its app.
    with pytest.raises(httpx.ConnectError):
        await asyncio.to_thread(scrape, port)

"""The registry answers every action of its table (swarm_contracts.registry_api), on the
subjects the table names, and no action is left out of it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.trace import NoOpTracer

from swarm_contracts.registry_api import SERVICE_ACTIONS, WORKER_ACTIONS
from swarm_registry.app import Catalogs, Handlers


def test_each_action_of_the_table_has_one_handler() -> None:
    handlers = Handlers(Catalogs(), NoOpTracer())
    served = [r.action for r in handlers.routes()]
    assert sorted(a.name for a in served) == sorted(a.name for a in SERVICE_ACTIONS)
    assert len(set(served)) == len(served)
    from_workers = [r.action for r in handlers.worker_routes()]
    assert sorted(a.name for a in from_workers) == sorted(a.name for a in WORKER_ACTIONS)


@pytest.mark.parametrize("scope", ["service", "worker"])
async def test_every_action_is_answered_on_its_subject(client: Any, scope: str) -> None:
    """A request no action accepts (a JSON list): each subject has a registry behind it, which
    refuses it as invalid, rather than nobody answering."""
    s = client.subjects
    actions = SERVICE_ACTIONS if scope == "service" else WORKER_ACTIONS
    for action in actions:
        subject = (
            s.registry(action.name) if scope == "service" else s.worker_registry(action.name, "w1")
        )
        reply = json.loads((await client.nc.request(subject, b"[]", timeout=5)).data)
        assert reply["ok"] is False, (action.name, reply)
        assert reply["code"] == "invalid", (action.name, reply)

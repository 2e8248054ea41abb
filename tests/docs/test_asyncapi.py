"""The checked-in AsyncAPI documents are what the services' FastStream apps declare."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("asyncapi_tool", ROOT / "tools" / "asyncapi.py")
tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
spec.loader.exec_module(tool)  # type: ignore[union-attr]


@pytest.mark.parametrize("service", tool.SERVICES)
def test_asyncapi_document_is_current(service: str) -> None:
    checked_in = (ROOT / "docs" / "asyncapi" / f"{service}.yaml").read_text()
    assert tool.render(service) == checked_in, f"run `make asyncapi` to refresh {service}.yaml"


def test_the_contract_subjects_are_in_the_documents() -> None:
    text = "".join((ROOT / "docs" / "asyncapi" / f"{s}.yaml").read_text() for s in tool.SERVICES)
    for subject in (
        "swarm.jobs.submit",
        "swarm.jobs.*.events.*",
        "swarm.jobs.*.cancel",
        "swarm.workers.*.heartbeat",
    ):
        assert subject in text

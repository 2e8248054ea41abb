"""Write the AsyncAPI document of each FastStream service to docs/asyncapi/<service>.yaml.

Run with ``make asyncapi``; tests/docs/test_asyncapi.py fails when a document is stale.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import yaml
from faststream.specification import AsyncAPI

from swarm_runtime.settings import Settings
from swarm_trainer.settings import TrainerSettings

SERVICES = ("scheduler", "trainer", "registry", "telemetry", "sweeps", "inference")
OUT = Path(__file__).resolve().parent.parent / "docs" / "asyncapi"


def render(service: str) -> str:
    build_app = importlib.import_module(f"swarm_{service}.app").build_app
    # Explicit values, so that the environment never leaks into the documents.
    shared: dict[str, Any] = {"nats_url": "nats://127.0.0.1:4222", "namespace": ""}
    settings = (
        TrainerSettings(worker_id="worker-id", **shared)
        if service == "trainer"
        else Settings(**shared)
    )
    app = build_app(settings)
    app = getattr(app, "app", app)  # telemetry wraps its FastStream app with an HTTP server
    for intake in app.context.get("intakes") or []:  # handlers on plain nats-py (the scheduler)
        intake.document(app.broker)
    for declare in app.context.get("documented") or []:  # subscribed at run time (inference)
        declare(app.broker)
    spec = AsyncAPI(app.broker, title=f"Swarm {service}", version="1.0.0")
    # FastStream lists channels in no fixed order; sorted keys keep the files diff-able.
    return yaml.safe_dump(yaml.safe_load(spec.to_specification().to_yaml()), sort_keys=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for service in SERVICES:
        (OUT / f"{service}.yaml").write_text(render(service))
        print(f"wrote {OUT / service}.yaml", file=sys.stderr)


if __name__ == "__main__":
    main()

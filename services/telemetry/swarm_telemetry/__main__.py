"""``python -m swarm_telemetry``: the event consumer and the HTTP server in one process."""

from __future__ import annotations

import asyncio
import logging

from swarm_telemetry.app import build_app
from swarm_telemetry.settings import TelemetrySettings


def main() -> None:
    settings = TelemetrySettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build_app(settings).run())


if __name__ == "__main__":
    main()

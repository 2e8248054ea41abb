"""``python -m swarm_registry``: run the registry until interrupted."""

from __future__ import annotations

import asyncio
import logging

from swarm_registry.app import build_app
from swarm_runtime.settings import Settings


def main() -> None:
    settings = Settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build_app(settings).run())


if __name__ == "__main__":
    main()

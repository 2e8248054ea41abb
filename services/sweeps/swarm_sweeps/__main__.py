"""``python -m swarm_sweeps``: run the sweep controller until interrupted."""

from __future__ import annotations

import asyncio
import logging

from swarm_runtime.settings import Settings
from swarm_sweeps.app import build_app


def main() -> None:
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    asyncio.run(build_app(settings).run())


if __name__ == "__main__":
    main()

"""``python -m swarm_gateway``: serve the API on settings.gateway_host:gateway_port."""

from __future__ import annotations

import logging

import uvicorn

from swarm_gateway.app import create_app
from swarm_gateway.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    uvicorn.run(
        create_app(settings),
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level=settings.log_level.lower(),
    )


if __name__ == "__main__":
    main()

"""Swarm's HTTP gateway: the front door for users, the CLI and the SDK."""

from swarm_gateway.app import create_app

__all__ = ["create_app"]

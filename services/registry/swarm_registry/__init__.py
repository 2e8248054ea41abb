"""The registry service: base models and adapters as versioned, content-hashed artifacts."""

from swarm_registry.app import build_app

__all__ = ["build_app"]

"""The one error a registry caller is meant to read."""

from __future__ import annotations

from swarm_runtime.rpc import Refused


class RegistryError(Refused):
    """A request the registry refuses: its message and code (``not_found``, ``conflict``,
    ``invalid``, ...) go back to the caller as ``Reply.error`` and ``Reply.code``."""

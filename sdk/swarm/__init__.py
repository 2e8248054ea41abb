"""Swarm's Python SDK: ``swarm.Client`` (sync) and ``swarm.AsyncClient`` talk to the gateway."""

from swarm.aio import AsyncClient
from swarm.client import Client
from swarm.completions import Completion, CompletionChunk
from swarm.errors import (
    AuthError,
    NotFoundError,
    ServiceUnavailableError,
    SwarmError,
    ValidationError,
)
from swarm.sse import JobStreamEvent

__all__ = [
    "AsyncClient",
    "AuthError",
    "Client",
    "Completion",
    "CompletionChunk",
    "JobStreamEvent",
    "NotFoundError",
    "ServiceUnavailableError",
    "SwarmError",
    "ValidationError",
]

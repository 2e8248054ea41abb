"""The gateway's own settings (``SWARM_*``), beside the shared ones of ``swarm_runtime``."""

from __future__ import annotations

from pydantic import Field

from swarm_runtime.settings import Settings


class GatewaySettings(Settings):
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    # "key=tenant" pairs, comma separated; empty means auth is off and every caller is tenant
    # "default" (the embedded local stack).
    api_keys: str = ""
    # Keys that see every tenant's jobs and the worker table (same forms as api_keys, without
    # "=tenant": "key" or "sha256:<hex>"); a tenant named "admin" in api_keys is an admin too.
    admin_keys: str = ""
    max_upload_bytes: int = 256 * 1024 * 1024
    # An inference worker that sent nothing on a request for this long is taken for dead (a
    # worker sends a keepalive chunk every SWARM_INFERENCE_KEEPALIVE_S); tries per request
    # while nothing was streamed.
    inference_idle_timeout_s: float = Field(default=10.0, gt=0)
    inference_attempts: int = Field(default=3, ge=1)

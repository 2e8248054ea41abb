"""The telemetry service's own settings (``SWARM_*``), beside the shared ones of
``swarm_runtime``."""

from __future__ import annotations

from swarm_runtime.settings import Settings


class TelemetrySettings(Settings):
    # Its HTTP API (GET /v1/jobs/{id}/metrics, /healthz, /metrics).
    telemetry_host: str = "127.0.0.1"
    telemetry_port: int = 8081

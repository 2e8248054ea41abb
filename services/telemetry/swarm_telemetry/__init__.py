"""The telemetry service: per-job metric series rebuilt from the replayable job events."""

from swarm_telemetry.app import TelemetryService, build_app

__all__ = ["TelemetryService", "build_app"]

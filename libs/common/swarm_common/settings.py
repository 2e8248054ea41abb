"""Configuration read from the environment (prefix ``SWARM_``), the same for every service."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWARM_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    # Credentials for the NATS connection; at most one scheme is used (user/password wins).
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed_file: Path | None = None
    nats_creds_file: Path | None = None

    # Prefixes every subject, stream and bucket so that several Swarms (or tests) can share
    # one NATS server. Empty in production: the public subjects are then exactly the contract.
    namespace: str = Field(default="", pattern=r"^[a-z0-9_-]*$")

    store_url: str = "file://.swarm/store"
    s3_access_key: str | None = None
    s3_secret_key: SecretStr | None = None
    s3_region: str | None = None

    # Gateway side.
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    # "key=tenant" pairs, comma separated; empty means auth is off and every caller is tenant
    # "default" (the embedded local stack).
    api_keys: str = ""
    # Keys that see every tenant's jobs and the worker table (same forms as api_keys, without
    # "=tenant": "key" or "sha256:<hex>"); a tenant named "admin" in api_keys is an admin too.
    admin_keys: str = ""
    max_upload_bytes: int = 256 * 1024 * 1024

    # CLI / SDK side.
    gateway_url: str = "http://127.0.0.1:8080"
    api_key: str | None = None

    # Scheduler.
    worker_timeout_s: float = 15.0
    max_attempts: int = 3
    # An assignment the trainer has not confirmed with `started` in this time, or a running job
    # its worker's heartbeats have stopped listing for this long, is requeued.
    assign_timeout_s: float = 60.0
    # A cancelled job still only assigned (never started) is ended by the scheduler after this.
    cancel_grace_s: float = 10.0
    # Most jobs one tenant may have assigned or running at once; 0 means no limit.
    tenant_max_running: int = Field(default=0, ge=0)
    # Scheduler leadership: the leader renews its lease about every third of this; a follower
    # takes over once the lease is this old.
    leader_lease_s: float = 3.0

    # Trainer agent.
    worker_id: str | None = None
    heartbeat_interval_s: float = 2.0
    trainer_cpus: int | None = None
    # "key=value" pairs, comma separated (e.g. "provider=acme,region=eu"): this worker's labels,
    # which jobs can require through resources.labels.
    worker_labels: str = ""
    work_dir: Path = Path(".swarm/work")

    # Telemetry.
    telemetry_host: str = "127.0.0.1"
    telemetry_port: int = 8081
    otel_exporter: str = Field(default="none", pattern=r"^(none|console|otlp)$")
    otel_endpoint: str | None = None

    def otlp_url(self, signal: str) -> str | None:
        """SWARM_OTEL_ENDPOINT names the collector; the OTLP/HTTP exporters want the path of
        the signal (``traces``, ``metrics``) on it."""
        if not self.otel_endpoint:
            return None
        base = self.otel_endpoint.rstrip("/")
        return base if base.endswith(f"/v1/{signal}") else f"{base}/v1/{signal}"

    # Prometheus /metrics of the scheduler, registry and trainer (the gateway and telemetry
    # serve it on their HTTP port). Unset: no metrics server; 0: a free port, logged.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

    log_level: str = "INFO"

"""Configuration read from the environment (prefix ``SWARM_``): what every service shares.

NATS and its credentials, the namespace, the object store, telemetry, metrics and logs, and
the few knobs several services must agree on. A service's own knobs are in its own settings
class next to its code (``swarm_scheduler.settings.SchedulerSettings``, ...), a subclass of
this one, read from the same ``SWARM_*`` variables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    # Unknown SWARM_* variables are left alone (another service's, the CLI's), but a value
    # given in code for a setting this class lacks is an error rather than silently dropped.
    model_config = SettingsConfigDict(env_prefix="SWARM_", extra="forbid")

    @classmethod
    def of(cls, settings: Settings, **changes: Any) -> Self:
        """``settings`` as this class: the values it holds that this class has too, then
        ``changes``; this class's other settings from the environment, as always. How a
        service that was handed the shared settings (a test, an embedding program) gets its
        own."""
        if type(settings) is cls and not changes:
            return settings
        shared = {
            name: getattr(settings, name)
            for name in type(settings).model_fields
            if name in cls.model_fields
        }
        return cls(**(shared | changes))

    nats_url: str = "nats://127.0.0.1:4222"
    # Credentials for the NATS connection; at most one scheme is used (user/password wins).
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed_file: Path | None = None
    nats_creds_file: Path | None = None
    # TLS to NATS (docs/security.md): the CA that signed the server's certificate (else the
    # system's CAs, with a tls:// URL), and this client's certificate and key where the server
    # verifies clients (`verify: true`).
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # A provider's join file (``swarm providers add``; docs/providers.md): its NATS identity,
    # used instead of the credentials above, and its provider name, which is the agent's
    # worker id. Set by ``swarm-trainer join --creds FILE``.
    provider_creds_file: Path | None = None

    @field_validator(
        "nats_nkey_seed_file",
        "nats_creds_file",
        "nats_tls_ca",
        "nats_tls_cert",
        "nats_tls_key",
        "provider_creds_file",
    )
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # These travel to the trainer's Ray processes, which run in another working directory:
        # a relative path there names another file, or none.
        return absolute(path) if path is not None else None

    # Prefixes every subject, stream and bucket so that several Swarms (or tests) can share
    # one NATS server. Empty in production: the public subjects are then exactly the contract.
    namespace: str = Field(default="", pattern=r"^[a-z0-9_-]*$")

    store_url: str = "file://.swarm/store"
    s3_access_key: str | None = None
    s3_secret_key: SecretStr | None = None
    s3_region: str | None = None
    # The store endpoint as workers outside the cluster's network reach it, when that is not
    # the endpoint of SWARM_STORE_URL (e.g. http://minio:9000 inside compose): the registry
    # signs the URLs it hands to workers for this host (docs/providers.md, *Store access*).
    s3_public_endpoint: str | None = None

    # Where a worker (trainer or inference) keeps its local files: runs, checkpoints being
    # written, the cache of base models and datasets.
    work_dir: Path = Path(".swarm/work")
    # Workers (trainer and inference) heartbeat this often; the gateway takes an inference
    # worker that missed a few for gone.
    heartbeat_interval_s: float = 2.0
    # Leadership of the scheduler's and the sweeps controller's processes: the leader renews
    # its lease about every third of this; a follower takes over once the lease is this old.
    leader_lease_s: float = 3.0
    # Largest max_tokens of a generation: the gateway refuses more, and so does the worker.
    inference_max_tokens: int = Field(default=2048, ge=1)

    # Telemetry: traces and metrics over OpenTelemetry.
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
    # Replicas of every stream and KV bucket Swarm creates: 1 on one nats-server, 3 on a
    # 3-node cluster (deploy/nats/nats-cluster.conf, docs/reliability.md). Applied when a
    # service creates or updates them at start-up.
    js_replicas: int = Field(default=1, ge=1, le=5)


def absolute(path: Path) -> Path:
    """``path`` made absolute against this process's working directory (``~`` expanded)."""
    return path.expanduser().absolute()

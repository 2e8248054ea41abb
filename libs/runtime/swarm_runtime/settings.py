"""Configuration read from the environment (prefix ``SWARM_``), the same for every service."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
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
    # How a trainer reaches the store: "keys" with the S3 keys above (or a local directory),
    # "signed" without any: every operation is granted by the registry for the keys of the
    # job's own attempt (swarm.registry.store.access). `swarm-trainer join` defaults to
    # "signed" when no S3 keys are set.
    store_access: Literal["keys", "signed"] = "keys"

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
    # A cancelled job its worker has not reported stopped (a worker reports within about 2 s,
    # even while Ray is still starting the run) is ended by the scheduler after this: a cancel
    # takes effect within about this plus a second from any state.
    cancel_grace_s: float = 4.0
    # Most jobs one tenant may have assigned or running at once; 0 means no limit.
    tenant_max_running: int = Field(default=0, ge=0)
    # Scheduler leadership: the leader renews its lease about every third of this; a follower
    # takes over once the lease is this old.
    leader_lease_s: float = 3.0
    # Among the workers a job fits: "best_fit" takes the one left with the least spare room
    # (equally fitting ones: the faster first), "fastest" the fastest by its self-benchmark
    # (equally fast ones: the best fit first). Workers without a benchmark count as slowest.
    placement_order: Literal["best_fit", "fastest"] = "best_fit"
    # A worker whose benchmark measures below this fraction of what it advertises (or its GPU
    # model's datasheet TFLOP/s) is flagged "slow".
    slow_fraction: float = Field(default=0.3, ge=0, le=1)
    # Verification of untrusted work (docs/providers.md): this fraction of succeeded jobs,
    # drawn at random once each has ended, is replayed in part on another worker.
    verify_fraction: float = Field(default=0.0, ge=0, le=1)
    # A replay that does not match marks the worker suspect, and fails the job ("fail") or
    # queues it again to train from the start elsewhere ("rerun").
    verify_policy: Literal["fail", "rerun"] = "fail"
    # Largest relative L2 distance of any LoRA matrix, and relative difference of any step's
    # loss, that still match. A replay runs the same spec (so the same device kind and
    # precision): fp32 on CPUs reproduces a run bit for bit; bf16 on GPU models with different
    # kernels drifts, which the 5 % margin leaves room for (a cheat smaller than that passes).
    verify_tolerance: float = Field(default=0.05, gt=0)
    verify_loss_tolerance: float = Field(default=0.05, gt=0)

    # Trainer agent.
    worker_id: str | None = None
    heartbeat_interval_s: float = 2.0
    trainer_cpus: int | None = None
    # A Tinker training session no call has touched for this long is closed (its model and
    # optimizer freed; what was saved stays): docs/tinker.md.
    session_idle_s: float = Field(default=900.0, gt=0)
    # "key=value" pairs, comma separated (e.g. "provider=acme,region=eu"): this worker's labels,
    # which jobs can require through resources.labels.
    worker_labels: str = ""
    work_dir: Path = Path(".swarm/work")
    # On SIGTERM the agent checkpoints its running jobs and hands them back; a job that has
    # not stopped within this long is left to the scheduler (its lease), and the agent exits.
    shutdown_grace_s: float = Field(default=120.0, ge=0)
    # The self-benchmark at start and on request: about this many seconds of measuring (a
    # matmul, then LoRA training steps of a tiny Llama); 0 skips it (tests).
    benchmark_s: float = Field(default=1.0, ge=0, le=60)
    # An idle agent measures again this often (0: never), and as soon as it is idle when its
    # last measurement ran beside jobs; heartbeats carry the best of its last few idle runs.
    benchmark_every_s: float = Field(default=3600.0, ge=0)
    # The dense TFLOP/s this provider promises for its worker (default: what its GPU model's
    # datasheet says); a benchmark far below it flags the worker "slow".
    advertised_tflops: float | None = Field(default=None, gt=0)
    # Base models and datasets the agent's ranks download are kept here between jobs, by
    # content digest (default: <work_dir>/cache), up to this many bytes: the least recently
    # used entry not in use is evicted first (see swarm_trainer.cache).
    trainer_cache_dir: Path | None = None
    trainer_cache_max_bytes: int = Field(default=32 * 1024**3, ge=0)
    # Tests only: the name of a ``swarm_trainer.hooks`` test hook every job of this agent runs
    # with (e.g. "perturb_checkpoints": a deliberately dishonest worker).
    trainer_test_hook: str = ""

    # Inference worker. Base models to hold, comma separated: "tiny-llama" (its latest
    # version, and each newer one as it is registered), "tiny-llama@2", or "*" for every
    # registered base model; checked again every inference_refresh_s.
    inference_models: str = "*"
    inference_worker_id: str | None = None
    inference_device: str = Field(default="auto", description="auto, cpu, cuda, cuda:1, ...")
    inference_dtype: str = Field(default="auto", pattern=r"^(auto|float32|bfloat16|float16)$")
    inference_backend: str = Field(default="swarm", pattern=r"^(swarm|vllm)$")
    # torch's intra-op threads on a CPU worker (unset: torch's default, one per core). On a
    # machine shared with other busy processes, fewer threads avoid OpenMP spin-waiting.
    inference_cpu_threads: int | None = Field(default=None, ge=1)
    inference_max_batch_size: int = Field(default=16, ge=1)
    # An idle engine lets a first request wait this long for others to share its prefill.
    inference_max_wait_ms: float = Field(default=5.0, ge=0)
    inference_adapter_slots: int = Field(default=8, ge=1)
    # Requests a worker keeps waiting beyond its batch; more are turned away ("overloaded"),
    # and the gateway tries another worker.
    inference_max_queue: int = Field(default=256, ge=1)
    inference_refresh_s: float = Field(default=5.0, gt=0)
    # Worker: a keepalive chunk on each open request this often. Gateway: a worker that sent
    # nothing on a request for inference_idle_timeout_s is taken for dead.
    inference_keepalive_s: float = Field(default=1.0, gt=0)
    inference_idle_timeout_s: float = Field(default=10.0, gt=0)
    # Gateway: largest max_tokens accepted, and tries per request while nothing was streamed.
    inference_max_tokens: int = Field(default=2048, ge=1)
    inference_attempts: int = Field(default=3, ge=1)

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
    # Replicas of every stream and KV bucket Swarm creates: 1 on one nats-server, 3 on a
    # 3-node cluster (deploy/nats/nats-cluster.conf, docs/reliability.md). Applied when a
    # service creates or updates them at start-up.
    js_replicas: int = Field(default=1, ge=1, le=5)


def absolute(path: Path) -> Path:
    """``path`` made absolute against this process's working directory (``~`` expanded)."""
    return path.expanduser().absolute()

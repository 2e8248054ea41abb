"""The inference worker's own settings (``SWARM_*``), beside the shared ones of
``swarm_runtime``."""

from __future__ import annotations

from pydantic import Field

from swarm_runtime.settings import Settings


class InferenceSettings(Settings):
    # Base models to hold, comma separated: "tiny-llama" (its latest version, and each newer
    # one as it is registered), "tiny-llama@2", or "*" for every registered base model;
    # checked again every inference_refresh_s.
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
    # A keepalive chunk on each open request this often (the gateway gives up on a worker
    # after SWARM_INFERENCE_IDLE_TIMEOUT_S of silence).
    inference_keepalive_s: float = Field(default=1.0, gt=0)

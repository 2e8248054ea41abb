"""The trainer agent's own settings (``SWARM_*``), beside the shared ones of ``swarm_runtime``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from swarm_runtime.settings import Settings


class TrainerSettings(Settings):
    # How the agent reaches the store: "keys" with the S3 keys of the shared settings (or a
    # local directory), "signed" without any: every operation is granted by the registry for
    # the keys of the job's own attempt (swarm.registry.store.access). `swarm-trainer join`
    # defaults to "signed" when no S3 keys are set.
    store_access: Literal["keys", "signed"] = "keys"
    worker_id: str | None = None
    trainer_cpus: int | None = None
    # The ranks' output in the agent's log too (Ray's log monitor: swarm_trainer.own_ray); it
    # is in the Ray node's log files either way.
    ray_worker_logs: bool = True
    # The agent's Ray forks its worker processes from a server that imported Ray Train, torch,
    # transformers and peft once (swarm_trainer.warm_start): seconds less for every attempt's
    # start. Only on a machine without GPUs: a fork after anything touched the CUDA driver
    # breaks CUDA in the child, and a GPU's run does not notice seconds at its start.
    ray_warm_start: bool = True
    # A Tinker training session no call has touched for this long is closed (its model and
    # optimizer freed; what was saved stays): docs/tinker.md.
    session_idle_s: float = Field(default=900.0, gt=0)
    # "key=value" pairs, comma separated (e.g. "provider=acme,region=eu"): this worker's labels,
    # which jobs can require through resources.labels.
    worker_labels: str = ""
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

"""The trainer agent's Prometheus metrics: training speed from rank 0's reports, and the
machine's CPU, memory and GPUs (the Ray workers are other processes, so the whole machine is
what is measured)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from swarm_contracts.events import JobEvent
from swarm_runtime.prometheus import nats_metrics_middleware
from swarm_trainer.reports import CheckpointReported, Progress, Report

log = logging.getLogger("swarm.trainer")

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _nvml() -> Any | None:
    """pynvml (package ``nvidia-ml-py``) when it is installed and finds a driver, else None.

    NVML reads utilization and memory without a CUDA context in this process, which
    ``torch.cuda`` would create (and hold hundreds of MB of GPU memory for)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


class _MachineCollector(Collector):
    def __init__(self, running_jobs: Callable[[], int], tokens_per_s: Callable[[], float]) -> None:
        self.running_jobs = running_jobs
        self.tokens_per_s = tokens_per_s
        psutil.cpu_percent(None)  # the first reading is meaningless: take it now
        self.nvml = _nvml()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "swarm_trainer_jobs_running", "Job attempts this agent runs", value=self.running_jobs()
        )
        yield GaugeMetricFamily(
            "swarm_trainer_tokens_per_second",
            "Training throughput, summed over this agent's running jobs (latest report of each)",
            value=self.tokens_per_s(),
        )
        yield GaugeMetricFamily(
            "swarm_trainer_cpu_utilization_ratio",
            "Machine CPU utilization since the previous scrape (0 to 1)",
            value=psutil.cpu_percent(None) / 100.0,
        )
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily(
            "swarm_trainer_memory_used_bytes", "Machine memory in use", value=memory.used
        )
        yield GaugeMetricFamily(
            "swarm_trainer_memory_total_bytes", "Machine memory", value=memory.total
        )
        if self.nvml is not None:
            yield from self._gpus()

    def _gpus(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        assert nvml is not None
        util = GaugeMetricFamily(
            "swarm_trainer_gpu_utilization_ratio", "GPU utilization (0 to 1)", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "swarm_trainer_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "swarm_trainer_gpu_memory_total_bytes", "GPU memory", labels=["gpu"]
        )
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util.add_metric([str(i)], rates.gpu / 100.0)
                used.add_metric([str(i)], memory.used)
                total.add_metric([str(i)], memory.total)
        except Exception:  # a driver hiccup must not fail the whole scrape
            log.warning("could not read GPU metrics", exc_info=True)
        yield from (util, used, total)


class TrainerMetrics:
    def __init__(self, running_jobs: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter(
            "swarm_trainer_steps_total",
            "Optimizer steps reported by rank 0",
            registry=self.registry,
        )
        self.step_time = Histogram(
            "swarm_trainer_step_duration_seconds",
            "Duration of one optimizer step (all micro-batches), measured on rank 0",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.jobs = Counter(
            "swarm_trainer_jobs_finished_total",
            "Job attempts this agent ended, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.checkpoints = Counter(
            "swarm_trainer_checkpoints_total", "Checkpoints committed", registry=self.registry
        )
        # job id -> latest tokens/s; only summed, never a label (job ids are unbounded).
        self._throughput: dict[str, float] = {}
        self.registry.register(
            _MachineCollector(running_jobs, lambda: sum(self._throughput.values()))
        )
        self.messages = nats_metrics_middleware(self.registry, "trainer")

    def observe(self, job_id: str, report: Report) -> None:
        """A report from rank 0 (see ``swarm_trainer.reports``)."""
        match report:
            case Progress():
                self.steps.inc()
                self.step_time.observe(report.step_s)
                self._throughput[job_id] = report.tokens_per_s
            case CheckpointReported():
                self.checkpoints.inc()

    def event(self, event: JobEvent) -> None:
        if event.meaning.terminal:
            self.jobs.labels(outcome=event.event).inc()
            self._throughput.pop(event.job_id, None)

    def job_ended(self, job_id: str) -> None:
        self._throughput.pop(job_id, None)

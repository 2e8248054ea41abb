"""The self-benchmark: measured on this machine, carried by a real agent's heartbeats, shown by
the gateway and `swarm workers`, and rerun on request through the gateway and NATS."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest.mock import patch

import httpx
import nats
import pytest
import torch
from faststream.nats import NatsBroker
from rich.console import Console
from typer.testing import CliRunner

from swarm.cli import app as cli_app
from swarm.cli.output import out
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import BenchmarkRequest, WorkerBenchmark
from swarm_gateway import create_app
from swarm_runtime.rpc import Refused
from swarm_runtime.settings import Settings
from swarm_trainer.agent import TrainerAgent
from swarm_trainer.app import build_app
from swarm_trainer.benchmark import _in_child, measure
from swarm_trainer.benchmark_history import Benchmarks
from swarm_trainer.settings import TrainerSettings

from ..conftest import ServerThread

pytestmark = pytest.mark.slow


def test_measure_reports_this_machines_speed() -> None:
    result = measure(0.2, torch.device("cpu"))
    assert (result.device, result.dtype, result.busy) == ("cpu", "float32", False)
    # Any machine that can run the tests multiplies at over a GFLOP/s and trains.
    assert 0.001 < result.matmul_tflops < 100
    assert result.train_tokens_per_s > 0
    assert 0 < result.duration_s < 30


async def test_a_gpu_worker_measures_in_a_child_process() -> None:
    # The path a CUDA machine takes (its CUDA context ends with the child), here on the CPU.
    result = await _in_child(0.1)
    assert result.device == ("cpu" if not torch.cuda.is_available() else result.device)
    assert result.matmul_tflops > 0
    assert result.train_tokens_per_s > 0


async def test_a_worker_with_its_benchmark_off_refuses_to_run_it(settings: Settings) -> None:
    agent = TrainerAgent(TrainerSettings.of(settings, benchmark_s=0.0), NatsBroker())
    with pytest.raises(Refused) as refused:
        await agent.benchmark_requested(BenchmarkRequest(worker_id=agent.worker_id))
    assert refused.value.code == "conflict"
    with pytest.raises(Refused):
        await agent.benchmark_requested(BenchmarkRequest(worker_id="someone-else"))


def cli(gateway_url: str, *args: str) -> tuple[int, str]:
    with patch.object(out, "console", Console(width=200)):
        result = CliRunner().invoke(cli_app, ["--url", gateway_url, *args])
    return result.exit_code, result.output


async def listed(client: httpx.AsyncClient, measured_after: Any = None) -> dict[str, Any]:
    """The worker as `GET /v1/workers` shows it, once it shows a benchmark (newer than
    ``measured_after``)."""
    for _ in range(100):
        workers = (await client.get("/v1/workers")).json()["data"]
        bench = workers[0]["benchmark"] if workers else None
        if bench and (measured_after is None or bench["measured_at"] > measured_after):
            return workers[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no (new) benchmark in the worker table: {workers}")


async def test_an_agent_joins_measured_and_measures_again_on_request(
    ray_cluster: None, settings: Settings
) -> None:
    from swarm_scheduler.app import build_app as build_scheduler

    s = Subjects(settings.namespace)
    settings = TrainerSettings.of(
        settings,
        worker_id="w-bench",
        heartbeat_interval_s=0.3,
        benchmark_s=0.2,
        advertised_tflops=1e6,  # more than any CPU: it must be flagged slow
    )
    heartbeats: list[dict[str, Any]] = []
    nc = await nats.connect(settings.nats_url)

    async def on_heartbeat(msg: Any) -> None:
        heartbeats.append(json.loads(msg.data)["data"])

    await nc.subscribe(s.heartbeat("w-bench"), cb=on_heartbeat)
    trainer = build_app(settings)
    try:
        async with build_scheduler(settings):
            await trainer.start()
            with ServerThread(create_app(settings, request_timeout_s=5.0)) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                    for _ in range(600):
                        if alive := [h for h in heartbeats if h["state"] == "alive"]:
                            break
                        await asyncio.sleep(0.05)
                    agent = trainer.agent  # type: ignore[attr-defined]
                    assert alive, f"no alive heartbeat in 30 s; {agent._heartbeat_task!r}"
                    # It heartbeats while it starts (and measures), but says it is alive only
                    # once measured: the scheduler never saw it alive unmeasured.
                    assert heartbeats[0]["state"] == "starting"
                    first = alive[0]["benchmark"]
                    assert first is not None
                    assert first["matmul_tflops"] > 0
                    assert first["train_tokens_per_s"] > 0
                    assert alive[0]["advertised_tflops"] == 1e6

                    worker = await listed(http)
                    assert worker["benchmark"] == first
                    assert worker["flags"] == ["slow"]
                    # The CLI blocks: in a thread, so that the agent (on this loop) can answer.
                    code, out = await asyncio.to_thread(cli, gw.url, "workers")
                    assert code == 0, out
                    assert "alive, slow" in out
                    assert "TFLOP/s" in out

                    # On request: the gateway asks the worker over NATS, which measures again
                    # and answers; its next heartbeat, and so the worker table, carry it.
                    code, out = await asyncio.to_thread(
                        cli, gw.url, "workers", "benchmark", "w-bench", "--json"
                    )
                    assert code == 0, out
                    again = WorkerBenchmark.model_validate_json(out)
                    assert again.measured_at.isoformat() > first["measured_at"][:-1]
                    assert again.device == "cpu"
                    worker = await listed(http, measured_after=first["measured_at"])
                    assert WorkerBenchmark.model_validate(worker["benchmark"]) == again
                    assert any(h["benchmark"] == worker["benchmark"] for h in heartbeats)

                    missing = await http.post("/v1/workers/nobody/benchmark")
                    assert missing.status_code == 404
    finally:
        await trainer.stop()
        await nc.close()


def bench(tflops: float, busy: bool = False) -> WorkerBenchmark:
    return WorkerBenchmark(
        matmul_tflops=tflops,
        train_tokens_per_s=tflops * 1000,
        device="cpu",
        dtype="float32",
        busy=busy,
        duration_s=1.0,
    )


def tflops(agent: TrainerAgent) -> float:
    assert agent.benchmark is not None
    return agent.benchmark.matmul_tflops


async def test_a_benchmark_taken_under_load_does_not_stand_for_ever(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: the first run, slowed by other load on the machine, stayed the worker's speed.
    An idle worker measures again (every SWARM_BENCHMARK_EVERY_S, at once when its run was
    busy), and reports the best of its recent idle runs."""
    import swarm_trainer.benchmark as benchmark_module

    runs = iter([bench(0.2), bench(1.0), bench(0.3), bench(0.1, busy=True), bench(0.9)])

    async def fake_run(budget_s: float, *, busy: bool = False) -> WorkerBenchmark:
        return next(runs)

    # The agent imports it when it measures (torch is imported only then).
    monkeypatch.setattr(benchmark_module, "run_benchmark", fake_run)
    agent = TrainerAgent(
        TrainerSettings.of(settings, benchmark_s=1.0, benchmark_every_s=0.05), NatsBroker()
    )
    await agent.measure()  # at start, under load
    assert tflops(agent) == 0.2
    assert not await agent.remeasure_if_due()  # not yet due
    await asyncio.sleep(0.06)
    assert await agent.remeasure_if_due()
    assert tflops(agent) == 1.0
    await asyncio.sleep(0.06)
    assert await agent.remeasure_if_due()
    # A slower run later does not replace the best recent one...
    assert tflops(agent) == 1.0
    # ...nor does a run beside jobs.
    agent.benchmarks.add(bench(0.1, busy=True))
    reported = agent.benchmarks.reported
    assert reported is not None
    assert reported.matmul_tflops == 1.0
    assert not agent.benchmarks.due(3600)
    # A worker that has only measured beside jobs measures again as soon as it is idle.
    beside_jobs = Benchmarks()
    beside_jobs.add(bench(0.1, busy=True))
    assert beside_jobs.due(3600)
    beside_jobs.add(bench(0.8))
    assert not beside_jobs.due(3600)
    # An operator's request starts afresh: what they asked for is what is carried.
    next(runs)
    asked = await agent.benchmark_requested(BenchmarkRequest(worker_id=agent.worker_id))
    assert asked.matmul_tflops == 0.9
    assert tflops(agent) == 0.9
    # Off: never again by itself.
    assert not agent.benchmarks.due(0)

"""Training sessions (the Tinker API, docs/tinker.md): per-call overhead of ``forward_backward``
+ ``optim_step`` through the gateway and NATS, against the same step called in-process.

Starts a private local stack (nats-server, gateway, scheduler, registry, trainer), registers the
tiny model, and with the stock ``tinker`` SDK runs ``--steps`` steps, each ``forward_backward``
then ``optim_step`` awaited one after the other (the latency a synchronous loop sees), each
right after the same step of the same ``TrainingSession`` (swarm_trainer.session) on the same
model in this process (A B A B: the machine's noise hits both alike), then
``--steps`` pipelined steps (both calls submitted before either is awaited, the next step
submitted before the last one is read; the worker's busy share of the wall time: the compute
time the worker reported for the calls, from the gateway's Prometheus metrics, over the wall
time, and as an estimate, the in-process step's time over the pipelined step's). Overhead per
call = (remote step - the in-process step just before it) / 2, p50 and p90.

    nice .venv/bin/python bench/sessions.py [--steps 30] [--tokens 64] [--datums 1]

``--datums``/``--tokens`` set the step's size: the issue's pipelining target is for steps of
about 100 ms (``--tokens 500 --datums 8`` on the tiny model, one thread, on the 2-core VM).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import tinker
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from tinker import types

from swarm.client import Client
from swarm.local_stack import LocalStack
from swarm_contracts.jobs import ModelRef
from swarm_contracts.sessions import AdamStep, CreateSession, SessionDatum
from swarm_trainer.session import TrainingSession
from swarm_trainer.tiny_model import create_tiny_model


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


Step = Callable[[], None]


def in_process(model_dir: Path, tokens: list[int], datums: int) -> Step:
    """One step of the same ``TrainingSession`` in this process."""
    import torch

    # As the stack's trainer runs it (SWARM_TRAINER_CPUS=1): one thread, not every core.
    torch.set_num_threads(1)
    ref = ModelRef(name="tiny-llama", version=1, store_key="-", digest="-")
    session = TrainingSession(CreateSession(base_model=ref, rank=4, seed=0), model_dir)
    one = SessionDatum(
        tokens=tokens[:-1],
        inputs={
            "target_tokens": [float(t) for t in tokens[1:]],
            "weights": [1.0] * (len(tokens) - 1),
        },
    )
    data = [one] * datums

    def step() -> None:
        session.forward(data, "cross_entropy", {}, backward=True)
        session.optim_step(AdamStep(learning_rate=1e-3))

    return step


def worker_compute_s(url: str) -> float:
    """The compute time the worker reported for every training call so far (the gateway's
    ``swarm_gateway_tinker_call_seconds{part="compute"}``)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "swarm_gateway_tinker_call_seconds"
        for sample in family.samples
        if sample.name.endswith("_sum") and sample.labels.get("part") == "compute"
    )


def timed(step: Step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(url: str, local: Step, tokens: list[int], steps: int, datums: int) -> Result:
    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=4, seed=0).result(
        timeout=300
    )
    d, adam = [datum(tokens)] * datums, types.AdamParams(learning_rate=1e-3)

    def remote() -> None:
        training.forward_backward(d, "cross_entropy").result()
        training.optim_step(adam).result()

    for _ in range(2):  # warm up
        local(), remote()
    # In-process and remote steps alternate (A B A B): both see the machine as it is then.
    computed = worker_compute_s(url)
    pairs = [(timed(local), timed(remote)) for _ in range(steps)]
    time.sleep(0.5)
    synchronous_busy_s = worker_compute_s(url) - computed
    computed += synchronous_busy_s
    start = time.perf_counter()
    pending = []
    for _ in range(steps):
        pending.append(training.forward_backward(d, "cross_entropy"))
        pending.append(training.optim_step(adam))
    for future in pending:
        future.result()
    wall = time.perf_counter() - start
    time.sleep(0.5)  # the last call's metrics are recorded as its future settles
    return Result(pairs, synchronous_busy_s, wall, worker_compute_s(url) - computed)


@dataclass
class Result:
    pairs: list[tuple[float, float]]  # (in-process step, remote step), seconds
    synchronous_busy_s: float  # the worker's compute time during the remote steps
    pipelined_s: float  # wall time of the pipelined steps
    busy_s: float  # the worker's compute time during them


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--datums", type=int, default=1, help="per forward_backward")
    args = parser.parse_args()
    tokens = [(7 * i + 3) % 500 + 1 for i in range(args.tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = create_tiny_model(root / "tiny-llama")
        local_step = in_process(model_dir, tokens, args.datums)
        local = LocalStack(
            root / "stack",
            free_ports=True,
            services=("gateway", "scheduler", "registry", "trainer"),
            console=Console(stderr=True, quiet=True),
            extra_env={"SWARM_TRAINER_CPUS": "1", "SWARM_BENCHMARK_S": "0"},
        )
        with local:
            client = Client(base_url=local.gateway_url)
            client.add_model("tiny-llama", model_dir)
            client.close()
            result = measure(local.gateway_url, local_step, tokens, args.steps, args.datums)
    local_times = [a for a, _ in result.pairs]
    local_p50 = statistics.median(local_times)
    overhead = sorted((b - a) / 2 for a, b in result.pairs)
    print(
        f"machine: {platform.machine()} {platform.system()}, "
        f"tiny-llama rank 4, {args.datums} x {args.tokens} tokens per step"
    )
    print(f"in-process step (fwd_bwd + optim_step): p50 {local_p50 * 1e3:.1f} ms")
    remote_p50 = statistics.median(b for _, b in result.pairs)
    worker_step = result.synchronous_busy_s / args.steps
    print(
        f"through gateway+NATS step: p50 {remote_p50 * 1e3:.1f} ms, of which the worker "
        f"computed {worker_step * 1e3:.1f} ms (mean)"
    )
    print(
        f"overhead per call (remote - in-process step, paired, / 2): "
        f"p50 {overhead[len(overhead) // 2] * 1e3:.1f} ms, "
        f"p90 {overhead[int(len(overhead) * 0.9)] * 1e3:.1f} ms"
    )
    estimate = local_p50 * args.steps / result.pipelined_s
    busy = result.busy_s / result.pipelined_s
    print(
        f"pipelined: {args.steps} steps in {result.pipelined_s:.2f} s, worker busy {busy:.0%} "
        f"(its compute {result.busy_s:.2f} s); in-process step time x steps / wall: {estimate:.0%}"
    )


if __name__ == "__main__":
    main()

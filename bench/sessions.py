"""Training sessions (the Tinker API, docs/tinker.md): per-call overhead of ``forward_backward``
+ ``optim_step`` through the gateway and NATS, against the same step called in-process.

Starts a private local stack (nats-server, gateway, scheduler, registry, trainer), registers the
tiny model, and with the stock ``tinker`` SDK runs ``--steps`` steps, each ``forward_backward``
then ``optim_step`` awaited one after the other (the latency a synchronous loop sees), then
``--steps`` pipelined steps (both calls submitted before either is awaited, the next step
submitted before the last one is read; the worker's busy share of the wall time). In-process,
the same ``TrainingSession`` (swarm_trainer.session) runs the same steps on the same model.
Overhead per call = (remote step - in-process step) / 2, p50 and p90.

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
from pathlib import Path

import numpy as np
import tinker
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


def in_process(model_dir: Path, tokens: list[int], steps: int, datums: int) -> list[float]:
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
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        session.forward(data, "cross_entropy", {}, backward=True)
        session.optim_step(AdamStep(learning_rate=1e-3))
        times.append(time.perf_counter() - start)
    return times[2:]  # the first steps warm up


def remote(url: str, tokens: list[int], steps: int, datums: int) -> tuple[list[float], float]:
    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=4, seed=0).result(
        timeout=300
    )
    d, adam = [datum(tokens)] * datums, types.AdamParams(learning_rate=1e-3)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        training.forward_backward(d, "cross_entropy").result()
        training.optim_step(adam).result()
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    pending = []
    for _ in range(steps):
        pending.append(training.forward_backward(d, "cross_entropy"))
        pending.append(training.optim_step(adam))
    for future in pending:
        future.result()
    return times[2:], time.perf_counter() - start


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
        local_times = in_process(model_dir, tokens, args.steps, args.datums)
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
            remote_times, pipelined_s = remote(local.gateway_url, tokens, args.steps, args.datums)
    local_p50 = statistics.median(local_times)
    overhead = sorted((r - local_p50) / 2 for r in remote_times)
    print(
        f"machine: {platform.machine()} {platform.system()}, "
        f"tiny-llama rank 4, {args.datums} x {args.tokens} tokens per step"
    )
    print(f"in-process step (fwd_bwd + optim_step): p50 {local_p50 * 1e3:.1f} ms")
    print(f"through gateway+NATS step: p50 {statistics.median(remote_times) * 1e3:.1f} ms")
    print(
        f"overhead per call: p50 {overhead[len(overhead) // 2] * 1e3:.1f} ms, "
        f"p90 {overhead[int(len(overhead) * 0.9)] * 1e3:.1f} ms"
    )
    busy = local_p50 * args.steps / pipelined_s
    print(f"pipelined: {args.steps} steps in {pipelined_s:.2f} s, worker busy ~{busy:.0%}")


if __name__ == "__main__":
    main()

"""The worker's self-benchmark: how fast it multiplies matrices and trains a LoRA adapter.

Run when the agent starts, again on request (``swarm workers benchmark ID``), and again while
the worker is idle every ``SWARM_BENCHMARK_EVERY_S`` (at once when the last one ran beside jobs);
heartbeats carry the best of the last few idle runs (``Benchmarks``), so that one run slowed by
other load on the machine does not stand for the machine for ever. Two measurements share the
time budget: dense square matmuls on the first GPU (bf16, or fp16 where the GPU has no bf16) or
on the CPUs (fp32), in TFLOP/s, and LoRA training steps of a tiny Llama built in memory, in
tokens/s, which also proves that the training stack (torch, transformers, peft, autograd) works
on this machine.

On a GPU machine it runs in a child process (``python -m swarm_trainer.benchmark``): the CUDA
context and the memory it takes go away with it, instead of staying with the agent for as long
as it runs, and a driver that hangs cannot take the agent with it. On a CPU machine it runs in
a thread of the agent (importing torch, transformers and peft into it the first time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM

from swarm_contracts.jobs import utcnow
from swarm_contracts.workers import WorkerBenchmark
from swarm_trainer.tiny_model import tiny_config

# Square matmuls big enough to keep a datacenter GPU's tensor cores busy, and small enough for
# a CPU to do a few within the budget.
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 1024
# The tiny training step: rows x tokens per step.
TRAIN_BATCH = 8
TRAIN_SEQ = 128
# Beyond the child process's own time (imports, CUDA start-up), what it may take at most.
CHILD_TIMEOUT_S = 120.0


def pick_device() -> torch.device:
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def pick_dtype(device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(device: torch.device, seconds: float, run: Callable[[], int]) -> float:
    """Work per second of ``run`` (which returns the work it did), called until ``seconds``
    have passed: the median of its calls, so that a moment of another process taking the
    machine does not decide the result. At least three calls where they fit in three times
    ``seconds`` (a slow machine still finishes in bounded time), and always one."""
    rates: list[float] = []
    started = time.perf_counter()
    while True:
        call = time.perf_counter()
        work = run()
        _sync(device)
        now = time.perf_counter()
        rates.append(work / max(now - call, 1e-9))
        if now - started >= seconds and (len(rates) >= 3 or now - started >= 3 * seconds):
            return statistics.median(rates)


def matmul_tflops(device: torch.device, dtype: torch.dtype, seconds: float) -> float:
    n = GPU_MATMUL_N if device.type == "cuda" else CPU_MATMUL_N
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    # Several matmuls between synchronisations on a GPU, so that waiting is not what is timed.
    per_call = 10 if device.type == "cuda" else 1

    def run() -> int:
        for _ in range(per_call):
            torch.matmul(a, b, out=out)
        return per_call

    run()  # warm-up: cuBLAS handle and kernel choice, CPU thread pool
    _sync(device)
    return 2 * n**3 * _rate(device, seconds, run) / 1e12


def train_tokens_per_s(device: torch.device, dtype: torch.dtype, seconds: float) -> float:
    torch.manual_seed(0)
    config = tiny_config()
    model = LlamaForCausalLM(config).to(device)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, config.vocab_size, (TRAIN_BATCH, TRAIN_SEQ), device=device)
    # As a job trains on a GPU: under autocast (fp32 weights; a float16 GPU without a gradient
    # scaler could overflow, so those train in fp32 here).
    autocast = device.type == "cuda" and dtype == torch.bfloat16

    def step() -> int:
        with torch.autocast(device.type, dtype=dtype, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return ids.numel()

    step()  # warm-up: autograd graph, optimizer state
    _sync(device)
    return _rate(device, seconds, step)


def measure(budget_s: float = 1.0, device: torch.device | None = None) -> WorkerBenchmark:
    """Half the budget on matmuls, half on training steps (see ``_rate``)."""
    device = device or pick_device()
    dtype = pick_dtype(device)
    started = time.perf_counter()
    with torch.enable_grad():  # the agent's thread may run under no_grad
        tflops = matmul_tflops(device, dtype, budget_s / 2)
        tokens = train_tokens_per_s(device, dtype, budget_s / 2)
    name = "cpu"
    if device.type == "cuda":
        name = f"{device} {torch.cuda.get_device_name(device)}"
        torch.cuda.empty_cache()
    return WorkerBenchmark(
        matmul_tflops=round(tflops, 4),
        train_tokens_per_s=round(tokens, 1),
        device=name,
        dtype=str(dtype).removeprefix("torch."),
        duration_s=round(time.perf_counter() - started, 3),
        measured_at=utcnow(),
    )


async def run_benchmark(budget_s: float, *, busy: bool = False) -> WorkerBenchmark:
    """Measure this machine now: in a child process where there is a GPU, else in a thread."""
    if torch.cuda.is_available():
        result = await _in_child(budget_s)
    else:
        result = await asyncio.to_thread(measure, budget_s)
    return result.model_copy(update={"busy": busy})


async def _in_child(budget_s: float) -> WorkerBenchmark:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "swarm_trainer.benchmark",
        "--budget",
        str(budget_s),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CHILD_TIMEOUT_S + budget_s)
    except TimeoutError:
        raise RuntimeError(f"the benchmark did not finish within {CHILD_TIMEOUT_S:g}s") from None
    finally:
        if proc.returncode is None:  # timed out, or the agent is stopping: no orphan left
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or ["no output"]
        raise RuntimeError(f"the benchmark failed (exit {proc.returncode}): {lines[-1]}")
    # The result is the last line: a library may have printed before it.
    return WorkerBenchmark.model_validate_json(out.decode().strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m swarm_trainer.benchmark",
        description="Measure this machine as a Swarm worker does; print the result as JSON.",
    )
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of measuring")
    parser.add_argument("--device", default=None, help="cpu, cuda:1, ... (default: cuda:0 or cpu)")
    args = parser.parse_args(argv)
    device = torch.device(args.device) if args.device else None
    print(measure(args.budget, device).model_dump_json())


if __name__ == "__main__":
    main()

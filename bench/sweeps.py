"""Sweeps benchmark: a sweep's trials spread over several trainer agents, and what TPE finds.

Starts a private local stack (nats-server, gateway, scheduler, registry, telemetry, sweeps) and
``--agents`` trainer agents with one CPU each, all real processes training the tiny model.

* speed: the wall time of a ``--trials``-trial random sweep run ``--agents`` trials at a time,
  against the same sweep (same seed: the random sampler proposes the same trials) run one trial
  at a time on one agent (its jobs pinned there by a worker label). Interleaved A B A B
  (``--repeat``), the median ratio printed.
* quality: the best eval loss a ``bayes`` (TPE) sweep and a ``random`` sweep find with the
  same budget, for each of ``--seeds`` seeds (the two sweeps of a seed run side by side).
  Training itself is seeded, so equal parameters give equal losses: the difference is the
  searcher's alone.

    .venv/bin/python bench/sweeps.py --agents 3 --trials 12 --repeat 2 --budget 8 --seeds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from swarm.client import Client
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack
from swarm_contracts.sweeps import SweepDetail
from swarm_trainer.tiny_model import create_tiny_model

SOLO = "solo"  # the label of the one agent the sequential runs are pinned to
SEARCH: dict[str, Any] = {
    "training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1},
    "lora.r": {"type": "choice", "values": [2, 4, 8, 16]},
    "training.warmup_steps": {"type": "int", "low": 0, "high": 4},
}


class Swarm:
    """The stack and its trainer agents."""

    def __init__(self, root: Path, agents: int) -> None:
        self.root = root
        services = ("gateway", "scheduler", "registry", "telemetry", "sweeps")
        self.local = LocalStack(
            root, free_ports=True, services=services, console=Console(stderr=True, quiet=True)
        )
        self.n_agents = agents
        self.agents: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def __enter__(self) -> Swarm:
        self.local.start()
        for i in range(self.n_agents):
            env = self.local.env() | {
                "SWARM_WORKER_ID": f"bench-{i}",
                "SWARM_TRAINER_CPUS": "1",
                "SWARM_WORKER_LABELS": f"bench={SOLO if i == 0 else 'any'}",
            }
            log = open(self.local.logs_dir / f"trainer-{i}.log", "ab")  # closed in __exit__
            self.logs.append(log)
            self.agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "swarm_trainer"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its Ray processes go with it at the end
                )
            )
        self.client = Client(base_url=self.local.gateway_url, timeout=60)
        deadline = time.monotonic() + 300
        while len([w for w in self.client.workers() if w.state == "alive"]) < self.n_agents:
            if time.monotonic() > deadline:
                raise RuntimeError(f"agents did not come up; see {self.local.logs_dir}")
            time.sleep(1)
        self.client.add_model("tiny-llama", create_tiny_model(self.root / "tiny-llama"))
        train, val = write_demo_datasets(self.root / "data", n_train=96, n_val=16)
        self.train = self.client.upload_dataset(train).id
        self.validation = self.client.upload_dataset(val).id
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.agents:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.client.close()
        self.local.stop()
        for log in self.logs:
            log.close()

    def spec(self, name: str, **overrides: Any) -> dict[str, Any]:
        return {
            "name": name,
            "base": {
                "base_model": "tiny-llama",
                "dataset": self.train,
                "validation": self.validation,
                "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
                "training": {
                    "max_steps": 6,
                    "batch_size": 4,
                    "seq_len": 64,
                    "eval_every": 3,
                    "checkpoint_every": 100,
                },
            },
            "search": SEARCH,
        } | overrides

    def run(self, spec: dict[str, Any], key: str) -> tuple[SweepDetail, float]:
        started = time.monotonic()
        sweep = self.client.create_sweep(spec, idempotency_key=key)
        done = self.client.wait_sweep(sweep.sweep_id, timeout=6 * 3600, poll_s=0.5)
        return done, time.monotonic() - started

    def start(self, spec: dict[str, Any], key: str) -> str:
        return self.client.create_sweep(spec, idempotency_key=key).sweep_id


def speed(swarm: Swarm, trials: int, repeat: int) -> list[tuple[float, float]]:
    rows = []
    for r in range(repeat):
        parallel = swarm.spec(
            "speed", algorithm="random", budget=trials, seed=r, max_concurrent=swarm.n_agents
        )
        one = swarm.spec("speed", algorithm="random", budget=trials, seed=r, max_concurrent=1)
        one["base"] |= {"resources": {"labels": {"bench": SOLO}}}
        a, a_s = swarm.run(parallel, f"speed-parallel-{r}")
        b, b_s = swarm.run(one, f"speed-one-{r}")
        # The same trials both ways: the random sampler is a function of the seed and trial.
        assert [t.params for t in a.trials] == [t.params for t in b.trials]
        assert a.state == b.state == "completed", (a.reason, b.reason)
        rows.append((a_s, b_s))
        print(f"  speed run {r + 1}: {a_s:.0f} s with {swarm.n_agents} agents, {b_s:.0f} s on one")
    return rows


def quality(swarm: Swarm, budget: int, seeds: int) -> list[tuple[int, float, float]]:
    rows = []
    for seed in range(seeds):
        ids = {
            algo: swarm.start(
                swarm.spec(f"q-{algo}", algorithm=algo, budget=budget, seed=seed, max_concurrent=2),
                f"quality-{algo}-{seed}",
            )
            for algo in ("random", "bayes")
        }
        best = {}
        for algo, sweep_id in ids.items():
            done = swarm.client.wait_sweep(sweep_id, timeout=6 * 3600, poll_s=1.0)
            assert done.best is not None, done.reason
            best[algo] = done.best.value
        rows.append((seed, best["random"], best["bayes"]))
        print(f"  quality seed {seed}: random {best['random']:.4f}, bayes {best['bayes']:.4f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=3, help="trainer agents, 1 CPU each")
    parser.add_argument("--trials", type=int, default=12, help="trials of the speed sweep")
    parser.add_argument("--repeat", type=int, default=2, help="speed runs (A B A B ...)")
    parser.add_argument("--budget", type=int, default=8, help="trials of each quality sweep")
    parser.add_argument("--seeds", type=int, default=3, help="quality: seeds per algorithm")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    root = Path(tempfile.mkdtemp(prefix="swarm-bench-sweeps-"))
    try:
        with Swarm(root, args.agents) as swarm:
            if not args.skip_speed:
                rows = speed(swarm, args.trials, args.repeat)
                print(f"\n{args.trials}-trial sweep, {args.agents} agents vs one at a time on one")
                print("| run | parallel (s) | one after another (s) | speed-up |")
                print("|---|---|---|---|")
                for i, (a, b) in enumerate(rows, 1):
                    print(f"| {i} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")
                ratio = statistics.median(b / a for a, b in rows)
                print(f"median speed-up: {ratio:.2f}x")
            if not args.skip_quality:
                rows_q = quality(swarm, args.budget, args.seeds)
                print(f"\nbest eval loss with {args.budget} trials (lower is better)")
                print("| seed | random | bayes (TPE) | bayes - random |")
                print("|---|---|---|---|")
                for seed, r, b in rows_q:
                    print(f"| {seed} | {r:.4f} | {b:.4f} | {b - r:+.4f} |")
                wins = sum(1 for _, r, b in rows_q if b < r)
                diff = statistics.median(b - r for _, r, b in rows_q)
                print(f"bayes better on {wins}/{len(rows_q)} seeds; median difference {diff:+.4f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

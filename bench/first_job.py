"""A newcomer's first job: from `swarm up` to a finished job, step by step (issue 25, item 5).

Each round starts a private local stack as `swarm up` does (nats-server, gateway, scheduler,
registry, telemetry, sweeps, one trainer agent), then does what the README's tour does: the
tiny model (``swarm models create-tiny``, pretrained; warm: from the machine's cache, which the
script fills once before the rounds), ``models add``, ``datasets upload examples/data.jsonl``,
``submit examples/job.yaml`` (10 steps) and waits for it to succeed. Printed per round and as
medians: the stack's start (until the gateway answers), the model, the upload, the job's wait
from ``queued`` to its first step (the worker's import of torch and start of Ray included when
they are not done yet) and from its first step to its end, and the total.

The peer is the goal the issue sets, 60 s warm; there is no other system to run beside it.

    .venv/bin/python bench/first_job.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console

from swarm.client import Client
from swarm.local_stack import LocalStack
from swarm.tiny_model import create_tiny_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GOAL_S = 60.0


def when(event: object) -> datetime | None:
    raw = getattr(event, "data", {}).get("time")
    return datetime.fromisoformat(raw) if isinstance(raw, str) else None


def one_round(root: Path) -> dict[str, float]:
    times: dict[str, float] = {}
    start = time.monotonic()
    local = LocalStack(root, free_ports=True, console=Console(stderr=True, quiet=True))
    with local:
        times["stack up"] = time.monotonic() - start
        client = Client(base_url=local.gateway_url)
        t = time.monotonic()
        model_dir = root / "tiny"
        create_tiny_model(model_dir)
        client.add_model("tiny-llama", model_dir)
        times["model (cached) + add"] = time.monotonic() - t
        t = time.monotonic()
        client.upload_dataset(EXAMPLES / "data.jsonl")
        times["dataset upload"] = time.monotonic() - t
        spec = yaml.safe_load((EXAMPLES / "job.yaml").read_text())
        t = time.monotonic()
        job = client.submit(spec, idempotency_key="first-job")
        record = client.wait(job.job_id, timeout=600)
        submitted_to_end = time.monotonic() - t
        if record.state != "succeeded":
            raise RuntimeError(f"the job {record.state}: {record.reason}\n{local.logs_dir}")
        events = list(client.events(job.job_id))
        queued = next(when(e) for e in events if e.event == "queued")
        first = next(when(e) for e in events if e.event == "progress")
        ended = next(when(e) for e in events if e.event == "succeeded")
        if queued is None or first is None or ended is None:
            raise RuntimeError("an event without its time")
        times["queued -> first step"] = (first - queued).total_seconds()
        times["first step -> succeeded"] = (ended - first).total_seconds()
        times["total"] = time.monotonic() - start
        times["(submit -> succeeded)"] = submitted_to_end
        client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as warm_up:
        create_tiny_model(Path(warm_up) / "tiny")  # fills the machine's cache: "warm"
    rounds = []
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory() as root:
            times = one_round(Path(root))
        rounds.append(times)
        console.print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    console.print(
        f"\n{platform.node()}, {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end"
    )
    console.print("| step | median (s) | rounds (s) |\n|---|---|---|")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        console.print(
            f"| {key} | {statistics.median(values):.1f} | "
            + ", ".join(f"{v:.1f}" for v in values)
            + " |"
        )
    total = statistics.median(r["total"] for r in rounds)
    console.print(f"\nmedian total {total:.1f} s: {total / GOAL_S:.2f}x the {GOAL_S:.0f} s goal")


if __name__ == "__main__":
    main()

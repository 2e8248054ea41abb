"""Gateway load run: SSE followers and job listings at once, for a fixed time.

Starts a private local stack (nats-server, gateway, scheduler, registry, telemetry), registers
the tiny model, submits ``--jobs`` jobs (no trainer runs: they stay queued, so the listing
holds them all), then for ``--seconds``:

* ``--followers`` SSE clients follow ``GET /v1/jobs/{id}/events`` (spread over the jobs), in
  their own process;
* ``--list-rate`` ``GET /v1/jobs`` requests per second, open loop (each request is due at a
  fixed time, whatever the earlier ones did), split over ``--list-procs`` processes with at
  most ``--concurrency`` in flight per process; a request's latency counts from when it was
  due, so a gateway that falls behind shows it (no coordinated omission);
* this process publishes ``--event-rate`` progress events per second on the followed jobs'
  subjects (as a trainer would; the scheduler ignores them: the jobs are not running), each
  stamped with its send time; a follower's delivery latency is receipt minus send time.

Prints the achieved list rate, list latency p50/p99, SSE delivery latency p50/p99, and the
errors of each kind (HTTP status >= 400, transport errors, SSE streams that ended early).

    .venv/bin/python bench/gateway_load.py [--followers 200] [--list-rate 500] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import multiprocessing.synchronize as mps
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import nats
from rich.console import Console

from swarm.client import Client
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack
from swarm_contracts.envelope import envelope
from swarm_contracts.events import Progress
from swarm_contracts.subjects import Subjects

Sync = mps.Event


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- load generators (each in its own process) ----------------------------------------------
def run_listers(
    url: str, rate: float, seconds: float, concurrency: int, out: Path, ready: Sync, go: Sync
) -> None:
    out.write_text(json.dumps(asyncio.run(_listers(url, rate, seconds, concurrency, ready, go))))


async def _listers(
    url: str, rate: float, seconds: float, concurrency: int, ready: Sync, go: Sync
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, due: float) -> None:
        async with gate:
            try:
                response = await client.get("/v1/jobs", params={"limit": 50})
                if response.status_code >= 400:
                    errors[f"http {response.status_code}"] = (
                        errors.get(f"http {response.status_code}", 0) + 1
                    )
                else:
                    latencies.append(time.monotonic() - due)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        ready.set()
        await asyncio.to_thread(go.wait)
        start = time.monotonic()
        tasks = []
        n = int(rate * seconds)
        for i in range(n):
            due = start + i / rate
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(client, due)))
            # Let started requests make progress between schedule points at high rates.
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
    return {"latencies": latencies, "errors": errors, "sent": n, "elapsed": elapsed}


def run_followers(
    url: str, job_ids: list[str], n: int, seconds: float, out: Path, ready: Sync, go: Sync
) -> None:
    out.write_text(json.dumps(asyncio.run(_followers(url, job_ids, n, seconds, ready, go))))


async def _followers(
    url: str, job_ids: list[str], n: int, seconds: float, ready: Sync, go: Sync
) -> dict[str, Any]:
    """``ready`` once every stream replayed its job's history (the ``queued`` event): the
    events published after ``go`` are then live ones, and their latency is the gateway's."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    connected = 0
    replayed = 0
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    deadline = time.monotonic() + 3600.0

    async def follow(client: httpx.AsyncClient, job_id: str) -> None:
        nonlocal connected, replayed
        try:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
                if response.status_code >= 400:
                    errors[f"http {response.status_code}"] = (
                        errors.get(f"http {response.status_code}", 0) + 1
                    )
                    return
                connected += 1
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                        if event == "queued":
                            replayed += 1
                    elif line.startswith("data:") and event == "progress":
                        data = json.loads(line[5:])["data"]
                        latencies.append(time.time() - data["elapsed_s"])
                if time.monotonic() < deadline:
                    errors["stream ended early"] = errors.get("stream ended early", 0) + 1
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    timeout = httpx.Timeout(30, read=None)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        tasks = [asyncio.create_task(follow(client, job_ids[i % len(job_ids)])) for i in range(n)]
        while replayed < n and not all(task.done() for task in tasks):
            await asyncio.sleep(0.1)
        ready.set()
        await asyncio.to_thread(go.wait)
        deadline = time.monotonic() + seconds
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"latencies": latencies, "errors": errors, "connected": connected}


# --- the event source -------------------------------------------------------------------------
async def publish_progress(nats_url: str, job_ids: list[str], rate: float, seconds: float) -> int:
    """Progress events round-robin over ``job_ids``; ``elapsed_s`` carries the send time."""
    subjects = Subjects("")
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sent = 0
    start = time.monotonic()
    try:
        while (now := time.monotonic()) - start < seconds:
            job_id = job_ids[sent % len(job_ids)]
            event = Progress(
                job_id=job_id,
                attempt=1,
                step=sent,
                max_steps=10**9,
                loss=1.0,
                lr=1e-3,
                tokens_per_s=0.0,
                elapsed_s=time.time(),
            )
            body = envelope("bench", "swarm.job.progress", event, subject=job_id)
            await js.publish(
                subjects.job_event(job_id, "progress"),
                body.model_dump_json().encode(),
                stream=subjects.events_stream,
            )
            sent += 1
            due = start + sent / rate
            await asyncio.sleep(max(0.0, due - now))
    finally:
        await nc.close()
    return sent


# --- the run ----------------------------------------------------------------------------------
def seed_jobs(client: Client, root: Path, n: int) -> list[str]:
    # Here, not at the top: the load processes import this module, and torch takes seconds.
    from swarm_trainer.tiny_model import create_tiny_model

    model_dir = create_tiny_model(root / "tiny-llama")
    client.add_model("tiny-llama", model_dir)
    train, _ = write_demo_datasets(root / "data", n_train=32, n_val=8)
    dataset = client.upload_dataset(train)
    spec = {
        "base_model": "tiny-llama",
        "dataset": dataset.id,
        "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {"max_steps": 4, "batch_size": 4, "seq_len": 64},
    }
    return [
        client.submit(spec | {"name": f"load-{i}"}, idempotency_key=f"load-{i}").job_id
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=200)
    parser.add_argument("--list-rate", type=float, default=500.0)
    parser.add_argument("--list-procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64, help="per lister process")
    parser.add_argument("--event-rate", type=float, default=50.0)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()

    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        services = ("gateway", "scheduler", "registry", "telemetry")
        local = LocalStack(
            root / "stack",
            free_ports=True,
            services=services,
            console=Console(stderr=True, quiet=True),
        )
        with local:
            client = Client(base_url=local.gateway_url)
            job_ids = seed_jobs(client, root, args.jobs)
            client.close()
            ctx = mp.get_context("spawn")
            followed = job_ids[: min(len(job_ids), args.followers)]
            outs = [root / f"lister{i}.json" for i in range(args.list_procs)]
            readies = [ctx.Event() for _ in range(args.list_procs + 1)]
            go = ctx.Event()
            procs = [
                ctx.Process(
                    target=run_listers,
                    args=(
                        local.gateway_url,
                        args.list_rate / args.list_procs,
                        args.seconds,
                        args.concurrency,
                        out,
                        ready,
                        go,
                    ),
                )
                for out, ready in zip(outs, readies, strict=False)
            ]
            follow_out = root / "followers.json"
            procs.append(
                ctx.Process(
                    target=run_followers,
                    args=(
                        local.gateway_url,
                        followed,
                        args.followers,
                        args.seconds + 2,
                        follow_out,
                        readies[-1],
                        go,
                    ),
                )
            )
            for proc in procs:
                proc.start()
            for ready in readies:  # every follower connected, every lister set up
                if not ready.wait(120):
                    raise SystemExit("a load process did not get ready in 120 s")
            go.set()
            events_sent = asyncio.run(
                publish_progress(local.nats_url, followed, args.event_rate, args.seconds)
            )
            for proc in procs:
                proc.join(args.seconds + 120)
            dead = local.dead_services()
            report(console, args, outs, follow_out, events_sent, dead)


def report(
    console: Console,
    args: argparse.Namespace,
    outs: list[Path],
    follow_out: Path,
    events_sent: int,
    dead: list[str],
) -> None:
    listers: list[dict[str, Any]] = [json.loads(out.read_text()) for out in outs]
    latencies = [x for lister in listers for x in lister["latencies"]]
    list_errors: dict[str, int] = {}
    for lister in listers:
        for kind, count in lister["errors"].items():
            list_errors[kind] = list_errors.get(kind, 0) + count
    elapsed = max(lister["elapsed"] for lister in listers)
    followers = json.loads(follow_out.read_text())
    delivery = followers["latencies"]
    console.print(f"machine: {platform.node()} {platform.machine()}, {mp.cpu_count()} CPUs")
    console.print(
        f"load: {args.followers} SSE followers, {args.list_rate:g} list req/s asked "
        f"({args.list_procs} processes, <= {args.concurrency} in flight each), "
        f"{args.event_rate:g} events/s, {args.jobs} jobs, {args.seconds:g} s"
    )
    console.print(
        f"GET /v1/jobs: {len(latencies)} ok of {sum(x['sent'] for x in listers)} sent, "
        f"{len(latencies) / elapsed:.0f} ok/s; latency from due time p50 "
        f"{1000 * statistics.median(latencies) if latencies else float('nan'):.1f} ms, "
        f"p99 {1000 * percentile(latencies, 0.99):.1f} ms; errors {list_errors or 'none'}"
    )
    expected = events_sent * args.followers / max(1, min(args.followers, args.jobs))
    console.print(
        f"SSE: {followers['connected']}/{args.followers} connected; "
        f"{len(delivery)} events delivered of {expected:.0f} expected; delivery latency p50 "
        f"{1000 * statistics.median(delivery) if delivery else float('nan'):.1f} ms, "
        f"p99 {1000 * percentile(delivery, 0.99):.1f} ms; errors {followers['errors'] or 'none'}"
    )
    console.print(f"services that died: {dead or 'none'}")


if __name__ == "__main__":
    main()

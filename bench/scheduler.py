"""Scheduler benchmark: placements/s and submit→assigned latency against the real processes.

Starts a private nats-server, the real registry and scheduler as processes, and plays N
simulated workers from this process (each heartbeats every 2 s and answers an assignment with
`started` then `succeeded`, through the public contract). Measures, in the same run:

* floor: a plain nats-py request/reply round trip on the same server;
* burst: placements/s while a backlog of submissions is placed;
* steady: submit→assigned latency (publish of the submission → the assignment arriving at the
  worker) at a fixed submission rate.

    .venv/bin/python bench/scheduler.py --workers 100 1000 --burst 2000 --rate 100 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nats

from swarm_common.datasets import DatasetInfo, dataset_id_for, dataset_store_key
from swarm_common.envelope import envelope
from swarm_common.events import Started, Succeeded
from swarm_common.jobs import AdapterRef, JobSpec
from swarm_common.records import RecordTable
from swarm_common.settings import Settings
from swarm_common.store import open_store
from swarm_common.subjects import Subjects
from swarm_common.topology import ensure_topology, kv_bucket
from swarm_common.workers import Heartbeat, Resources, RunningJob

DATASET_SHA = "cd" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Bench:
    def __init__(self, root: Path, n_workers: int) -> None:
        self.root = root
        self.n_workers = n_workers
        self.port = free_port()
        self.settings = Settings(
            nats_url=f"nats://127.0.0.1:{self.port}",
            namespace="b" + uuid.uuid4().hex[:8],
            store_url=(root / "store").as_uri(),
        )
        self.s = Subjects(self.settings.namespace)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.submitted: dict[str, float] = {}
        self.assigned: dict[str, float] = {}
        self.running: dict[str, list[RunningJob]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start_processes(self) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        cmd = [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.root)]
        self.procs.append(subprocess.Popen(cmd, stderr=subprocess.DEVNULL))
        env = dict(os.environ) | {
            "SWARM_NATS_URL": self.settings.nats_url,
            "SWARM_NAMESPACE": self.settings.namespace,
            "SWARM_STORE_URL": self.settings.store_url,
            "SWARM_LOG_LEVEL": "WARNING",
        }
        for svc in ("registry", "scheduler"):
            log = open(self.root / f"{svc}.log", "wb")  # noqa: SIM115 - lives with the process
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", f"swarm_{svc}"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait(10)

    async def setup(self) -> None:
        for _ in range(100):
            try:
                self.nc = await nats.connect(self.settings.nats_url)
                break
            except Exception:
                await asyncio.sleep(0.1)
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, self.s)
        datasets = RecordTable(await kv_bucket(self.js, self.s, "datasets"), DatasetInfo)
        self.dataset_id = dataset_id_for(DATASET_SHA)
        await datasets.put(
            f"default.{self.dataset_id}",
            DatasetInfo(
                id=self.dataset_id,
                tenant="default",
                sha256=DATASET_SHA,
                store_key=dataset_store_key("default", DATASET_SHA),
                format="text",
                examples=10,
                bytes=100,
            ),
        )
        model = self.root / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        (model / "model.safetensors").write_bytes(
            struct.pack("<Q", len(header)) + header + bytes(4)
        )
        open_store(self.settings).upload_dir(model, "models/tiny/x")
        for _ in range(100):  # the registry may still be starting
            try:
                reply = await self.nc.request(
                    self.s.registry("models.register"),
                    json.dumps({"name": "tiny", "store_key": "models/tiny/x"}).encode(),
                    timeout=2,
                )
                assert json.loads(reply.data)["ok"], reply.data
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                await asyncio.sleep(0.2)
        await self.nc.subscribe(self.s.assign(), cb=self.on_assign)
        self.spec = JobSpec(name="bench", base_model="tiny", dataset=self.dataset_id)

    # --- simulated workers ----------------------------------------------------------------
    async def heartbeats(self) -> None:
        res = Resources(cpus=4, memory_bytes=16 << 30)
        ids = [f"sim-{i:04d}" for i in range(self.n_workers)]
        while True:  # every worker every 2 s, spread evenly
            for wid in ids:
                hb = Heartbeat(
                    worker_id=wid, resources=res, free=res, running=self.running.get(wid, [])
                )
                await self.nc.publish(
                    self.s.heartbeat(wid),
                    envelope("bench", "swarm.worker.heartbeat", hb).model_dump_json().encode(),
                )
                await asyncio.sleep(2.0 / self.n_workers)

    async def on_assign(self, msg: nats.aio.msg.Msg) -> None:
        now = time.perf_counter()
        data = json.loads(msg.data)["data"]
        job_id, attempt, wid = data["job_id"], data["attempt"], data["worker_id"]
        self.assigned.setdefault(job_id, now)
        # Kept until done: the loop holds tasks only weakly.
        task = asyncio.create_task(self.run_job(job_id, attempt, wid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run_job(self, job_id: str, attempt: int, wid: str) -> None:
        adapter = AdapterRef(name="bench", version=1, store_key="adapters/default/bench/1")
        for event in (
            Started(job_id=job_id, attempt=attempt, worker_id=wid),
            Succeeded(job_id=job_id, attempt=attempt, adapter=adapter),
        ):
            await self.js.publish(
                self.s.job_event(job_id, event.event),
                envelope("bench", f"swarm.job.{event.event}", event, subject=job_id)
                .model_dump_json()
                .encode(),
                stream=self.s.events_stream,
            )

    # --- load -----------------------------------------------------------------------------
    async def submit(self, key: str) -> None:
        body = envelope(
            "bench",
            "swarm.job.submit",
            {"spec": self.spec.model_dump(mode="json"), "tenant": "default"},
        )
        from swarm_common.jobs import job_id_for

        self.submitted[job_id_for("default", key)] = time.perf_counter()
        await self.js.publish(
            self.s.submit, body.model_dump_json().encode(), headers={"Nats-Msg-Id": key}
        )

    async def wait_assigned(self, ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(i not in self.assigned for i in ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def floor(self, n: int = 1000) -> list[float]:
        async def echo(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(msg.data)

        sub = await self.nc.subscribe(f"{self.settings.namespace}.bench.echo", cb=echo)
        nc2 = await nats.connect(self.settings.nats_url)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await nc2.request(f"{self.settings.namespace}.bench.echo", b"x" * 200, timeout=2)
            out.append((time.perf_counter() - t) * 1000)
        await sub.unsubscribe()
        await nc2.close()
        return out

    async def burst(self, n: int) -> float:
        keys = [f"burst-{i}" for i in range(n)]
        start = time.perf_counter()
        for k in keys:
            await self.submit(k)
        ids = [i for i in self.submitted if i not in self.assigned][-n:]
        await self.wait_assigned(ids, timeout=120)
        done = [self.assigned[i] for i in ids if i in self.assigned]
        return len(done) / (max(done) - start) if done else 0.0

    async def steady(self, rate: float, seconds: float) -> list[float]:
        keys = [f"steady-{i}" for i in range(int(rate * seconds))]
        ids = []
        t0 = time.perf_counter()
        from swarm_common.jobs import job_id_for

        for n, k in enumerate(keys):
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.submit(k)
            ids.append(job_id_for("default", k))
        await self.wait_assigned(ids, timeout=60)
        return [(self.assigned[i] - self.submitted[i]) * 1000 for i in ids if i in self.assigned]


async def run(n_workers: int, burst: int, rate: float, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), n_workers)
        bench.start_processes()
        try:
            await bench.setup()
            beats = asyncio.create_task(bench.heartbeats())
            await asyncio.sleep(3.0)  # every worker heartbeated at least once
            floor = await bench.floor()
            await bench.steady(10, 1)  # warm-up
            placements = await bench.burst(burst)
            await asyncio.sleep(2.0)
            latency = await bench.steady(rate, seconds)
            beats.cancel()
            await bench.nc.close()
        finally:
            bench.stop()
    return {
        "workers": n_workers,
        "placements_s": placements,
        "p50": statistics.median(latency),
        "p99": pct(latency, 0.99),
        "n": len(latency),
        "floor_p50": statistics.median(floor),
        "floor_p99": pct(floor, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    rows = [asyncio.run(run(n, args.burst, args.rate, args.seconds)) for n in args.workers]
    print(f"\nscheduler benchmark ({os.cpu_count()} CPUs), latency at {args.rate:g} submissions/s")
    print(
        f"| workers | placements/s (burst of {args.burst}) | submit→assigned p50 / p99 ms | "
        "nats request/reply p50 / p99 ms |"
    )
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['placements_s']:.0f} | {r['p50']:.1f} / {r['p99']:.1f} "
            f"(n={r['n']}) | {r['floor_p50']:.2f} / {r['floor_p99']:.2f} |"
        )


if __name__ == "__main__":
    main()

"""Scheduler benchmark: placements/s and submit→assigned latency against the real processes.

Starts a private nats-server, the real registry and scheduler as processes, and plays N
simulated workers from this process (each heartbeats every 2 s and answers an assignment with
`started` then `succeeded`, through the public contract). Measures, in the same run:

* floor: a plain nats-py request/reply round trip on the same server;
* burst: placements/s while a backlog of submissions is placed;
* steady: submit→assigned latency (publish of the submission → the assignment arriving at the
  worker) at a fixed submission rate.

    .venv/bin/python bench/scheduler.py --workers 100 1000 --burst 2000 --seconds 10 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.envelope import CloudEvent, envelope
from swarm_contracts.events import Started, Succeeded
from swarm_contracts.jobs import AdapterRef, JobSpec, JobSubmission, job_id_for, utcnow
from swarm_contracts.layout import dataset_key
from swarm_contracts.providers import ATTEMPT_TOKEN_HEADER
from swarm_contracts.registry_api import REGISTER_MODEL
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Heartbeat, Resources, RunningJob
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import ensure_topology, kv_bucket

DATASET_SHA = "cd" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Bench:
    def __init__(self, root: Path, n_workers: int, profile: Path | None = None) -> None:
        self.root = root
        self.profile = profile
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
        self.spies: list[subprocess.Popen[bytes]] = []
        if self.profile:
            # Sampled from outside (py-spy, `pip install py-spy`): cProfile inside the service
            # slowed it several times over and lost its file when a loaded service was slow
            # to exit. Collapsed stacks, one file per process, written when it exits.
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            self.profile.mkdir(parents=True, exist_ok=True)
            record = ["record", "--rate", "250", "--format", "raw", "--nonblocking"]
            for name, proc in (("registry", self.procs[1]), ("scheduler", self.procs[2])):
                out = self.profile / f"{name}-{self.n_workers}.txt"
                self.spies.append(
                    subprocess.Popen(
                        [spy, *record, "--pid", str(proc.pid), "--output", str(out)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )

    def stop(self) -> None:
        # Every process is stopped even if one is slow to go: one left behind keeps the
        # output pipe open (nats-server writes to it) and the caller waiting.
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for spy in self.spies:  # each writes its file once its process is gone
            spy.wait(30)

    async def setup(self) -> None:
        for _ in range(100):  # nats-server may still be starting (nats-py prints each refusal)
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            await asyncio.sleep(0.05)
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
                store_key=dataset_key("default", DATASET_SHA),
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
                    self.s.registry(REGISTER_MODEL.name),
                    json.dumps({"name": "tiny", "store_key": "models/tiny/x"}).encode(),
                    timeout=2,
                )
                assert json.loads(reply.data)["ok"], reply.data
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                await asyncio.sleep(0.2)
        await self.nc.subscribe(self.s.assign(), cb=self.on_assign)
        self.spec = JobSpec(name="bench", base_model="tiny", dataset=self.dataset_id)
        self.make_templates()

    # --- simulated workers ----------------------------------------------------------------
    def heartbeat_bytes(self, wid: str, now: str) -> bytes:
        """A heartbeat's CloudEvent, filled into a template made once from the real models.

        Building a pydantic ``Heartbeat`` and its envelope per message cost the benchmark
        process about as much CPU as the scheduler spends on it, on the same two cores.
        """
        running = self.running.get(wid)
        running_json = (
            "[" + ",".join(r.model_dump_json() for r in running) + "]" if running else "[]"
        )
        self._serial += 1
        return (
            self._hb_template.replace("@ID@", f"{self._id_prefix}{self._serial:x}", 1)
            .replace("@WID@", wid, 1)
            .replace('"@RUNNING@"', running_json, 1)
            .replace("@TIME@", now, 2)
            .encode()
        )

    def make_templates(self) -> None:
        res = Resources(cpus=4, memory_bytes=16 << 30)
        stamp = datetime(2000, 1, 1, tzinfo=UTC)
        hb = Heartbeat(worker_id="@WID@", resources=res, free=res, time=stamp)
        ev = envelope("bench", "swarm.worker.heartbeat", hb).model_copy(
            update={"id": "@ID@", "time": stamp}
        )
        self._hb_template = (
            ev.model_dump_json()
            .replace('"running":[]', '"running":"@RUNNING@"', 1)
            # The two timestamps (envelope and heartbeat) are filled in per message.
            .replace(stamp.isoformat().replace("+00:00", "Z"), "@TIME@")
        )
        self._id_prefix, self._serial = uuid.uuid4().hex[:16], 0
        # The scheduler must accept what the template makes: check one against the contract.
        sample = self.heartbeat_bytes("sim-check", utcnow().isoformat())
        parsed = CloudEvent[Heartbeat].model_validate_json(sample)
        assert parsed.data.worker_id == "sim-check", sample
        assert parsed.time > stamp, sample
        # Job events and submissions: the models' own JSON, with the per-message fields set
        # per message (checked against the contract the same way).
        adapter = AdapterRef(name="bench", version=1, store_key="adapters/default/bench/1")
        self._started = Started(job_id="x", attempt=1, worker_id="w").model_dump(mode="json")
        self._succeeded = Succeeded(job_id="x", attempt=1, adapter=adapter).model_dump(mode="json")
        self._spec_json = self.spec.model_dump(mode="json")
        CloudEvent[JobSubmission].model_validate_json(self.submission("check")[1])
        data = self._succeeded | {"job_id": "job-1", "attempt": 2}
        event = CloudEvent[Succeeded].model_validate_json(
            self.event_bytes("swarm.job.succeeded", "job-1", data)
        )
        assert event.data.attempt == 2

    async def heartbeats(self) -> None:
        """Every worker every 2 s, spread over 50 ms ticks: the messages of a tick go out
        on the one connection in one write rather than one write (and one wake-up) each."""
        ids = [f"sim-{i:04d}" for i in range(self.n_workers)]
        subjects = [self.s.heartbeat(wid) for wid in ids]
        tick, period = 0.05, 2.0
        per_tick = max(1, round(self.n_workers * tick / period))
        i, next_tick = 0, time.perf_counter()
        while True:
            now = utcnow().isoformat()
            for _ in range(per_tick):
                k = i % self.n_workers
                await self.nc.publish(subjects[k], self.heartbeat_bytes(ids[k], now))
                i += 1
            next_tick += per_tick * period / self.n_workers  # keeps the rate if a tick ran late
            await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))

    async def on_assign(self, msg: nats.aio.msg.Msg) -> None:
        now = time.perf_counter()
        data = json.loads(msg.data)["data"]
        job_id, attempt, wid = data["job_id"], data["attempt"], data["worker_id"]
        self.assigned.setdefault(job_id, now)
        # Kept until done: the loop holds tasks only weakly.
        task = asyncio.create_task(self.run_job(job_id, attempt, wid, data.get("attempt_token")))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def event_bytes(self, type_: str, subject: str | None, data: dict[str, object]) -> bytes:
        """A CloudEvent as the contract spells it, built from a dict (no pydantic per message)."""
        self._serial += 1
        return json.dumps(
            {
                "specversion": "1.0",
                "id": f"{self._id_prefix}{self._serial:x}",
                "source": "swarm/bench",
                "type": type_,
                "time": utcnow().isoformat(),
                "subject": subject,
                "datacontenttype": "application/json",
                "data": data,
            }
        ).encode()

    async def run_job(self, job_id: str, attempt: int, wid: str, token: str | None) -> None:
        ids = {"job_id": job_id, "attempt": attempt}
        started = self._started | ids | {"worker_id": wid}
        # As a trainer does: the attempt's token, without which the scheduler ignores events.
        headers = {ATTEMPT_TOKEN_HEADER: token} if token else None
        for name, data in (("started", started), ("succeeded", self._succeeded | ids)):
            await self.js.publish(
                self.s.job_event(job_id, name),
                self.event_bytes(f"swarm.job.{name}", job_id, data),
                stream=self.s.events_stream,
                headers=headers,
            )

    # --- load -----------------------------------------------------------------------------
    def submission(self, key: str) -> tuple[str, bytes]:
        return job_id_for("default", key), self.event_bytes(
            "swarm.job.submit", None, {"spec": self._spec_json, "tenant": "default"}
        )

    async def submit(self, key: str, body: bytes | None = None) -> None:
        job_id, made = self.submission(key)
        self.submitted[job_id] = time.perf_counter()
        await self.js.publish(self.s.submit, body or made, headers={"Nats-Msg-Id": key})

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

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by each process: nats-server, registry, scheduler, bench."""
        out = {}
        for name, proc in zip(("nats", "registry", "scheduler"), self.procs, strict=True):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["bench"] = usage.ru_utime + usage.ru_stime
        return out

    async def burst(self, n: int) -> tuple[float, dict[str, float]]:
        """Placements/s for a backlog of ``n`` submissions, and each process's CPU ms per
        placement (less noisy than the rate on a shared machine)."""
        bodies = [(f"burst-{i}", self.submission(f"burst-{i}")[1]) for i in range(n)]
        cpu0 = self.cpu_s()
        start = time.perf_counter()
        # Pipelined, 64 in flight: the submissions must arrive faster than they are placed.
        for at in range(0, n, 64):
            await asyncio.gather(*(self.submit(k, b) for k, b in bodies[at : at + 64]))
        ids = [i for i in self.submitted if i not in self.assigned][-n:]
        await self.wait_assigned(ids, timeout=120)
        cpu1 = self.cpu_s()
        done = [self.assigned[i] for i in ids if i in self.assigned]
        per_job = {k: (cpu1[k] - cpu0[k]) * 1000 / max(1, len(done)) for k in cpu0}
        return (len(done) / (max(done) - start) if done else 0.0), per_job

    async def steady(self, rate: float, seconds: float) -> list[float]:
        keys = [f"steady-{i}" for i in range(int(rate * seconds))]
        ids = []
        t0 = time.perf_counter()
        for n, k in enumerate(keys):
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.submit(k)
            ids.append(job_id_for("default", k))
        await self.wait_assigned(ids, timeout=60)
        return [(self.assigned[i] - self.submitted[i]) * 1000 for i in ids if i in self.assigned]


async def run(
    n_workers: int, burst: int, rate: float, seconds: float, profile: Path | None = None
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), n_workers, profile)
        bench.start_processes()
        try:
            await bench.setup()
            beats = asyncio.create_task(bench.heartbeats())
            await asyncio.sleep(3.0)  # every worker heartbeated at least once
            floor = await bench.floor()
            await bench.steady(10, 1)  # warm-up
            placements, cpu = await bench.burst(burst)
            await asyncio.sleep(2.0)
            latency = await bench.steady(rate, seconds)
            beats.cancel()
            await bench.nc.close()
        finally:
            bench.stop()
    return {
        "workers": n_workers,
        "placements_s": placements,
        "cpu": cpu,
        "p50": statistics.median(latency),
        "p99": pct(latency, 0.99),
        "n": len(latency),
        "floor_p50": statistics.median(floor),
        "floor_p99": pct(floor, 0.99),
    }


def _row(r: dict, label: str) -> str:
    cpu = r["cpu"]
    return (
        f"| {label} | {r['workers']} | {r['placements_s']:.0f} | {cpu['scheduler']:.2f} / "
        f"{cpu['nats']:.2f} / {cpu['registry']:.2f} / {cpu['bench']:.2f} | "
        f"{r['p50']:.1f} / {r['p99']:.1f} (n={r['n']}) | "
        f"{r['floor_p50']:.2f} / {r['floor_p99']:.2f} | "
        f"{r['p50'] / r['floor_p50']:.0f}x / {r['p99'] / r['floor_p99']:.0f}x |"
    )


def _median(rows: list[dict]) -> dict:
    """Each number's median over the runs (the machine's speed moves from run to run)."""

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    out = {k: med(k) for k in ("placements_s", "p50", "p99", "n", "floor_p50", "floor_p99")}
    out["n"] = int(out["n"])
    out["workers"] = rows[0]["workers"]
    out["cpu"] = {k: statistics.median(r["cpu"][k] for r in rows) for k in rows[0]["cpu"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per worker count (median)")
    parser.add_argument(
        "--profile", type=Path, help="write py-spy profiles of the services into this folder"
    )
    args = parser.parse_args()
    runs = {
        n: [
            asyncio.run(run(n, args.burst, args.rate, args.seconds, args.profile))
            for _ in range(args.repeat)
        ]
        for n in args.workers
    }
    print(f"\nscheduler benchmark ({os.cpu_count()} CPUs), latency at {args.rate:g} submissions/s")
    print(
        f"| run | workers | placements/s (burst of {args.burst}) | CPU ms per placement: "
        "scheduler / nats-server / registry / bench | submit→assigned p50 / p99 ms | "
        "nats request/reply p50 / p99 ms | latency / floor p50 / p99 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rows in runs.values():
        for i, r in enumerate(rows, 1):
            print(_row(r, str(i)))
        if len(rows) > 1:
            print(_row(_median(rows), "**median**"))


if __name__ == "__main__":
    main()

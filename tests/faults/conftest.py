"""Fault tests: the real services as processes on a dedicated nats-server, which they may kill.

Each test gets its own nats-server (restarting it must not disturb other tests) and starts the
services it needs with short timeouts, so that a lost worker or leader is noticed in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from swarm_contracts.jobs import JobRecord, JobState
from swarm_trainer.tiny_model import create_tiny_model

from ..conftest import NatsServer, free_port

FAST = {
    "SWARM_WORKER_TIMEOUT_S": "3",
    "SWARM_HEARTBEAT_INTERVAL_S": "0.5",
    # A trainer's start of a job (Ray actors, resume copy, Ray Train) on a loaded CI machine.
    "SWARM_ASSIGN_TIMEOUT_S": "90",
    "SWARM_LEADER_LEASE_S": "2",
    "SWARM_MAX_ATTEMPTS": "5",
    "SWARM_TRAINER_CPUS": "1",
    "SWARM_LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}


def short_examples(n: int) -> bytes:
    """Sums, each a few tokens: every one keeps its answer within the fault jobs' seq_len 32
    (the demo's chats would not)."""
    rows = (
        json.dumps({"prompt": f"{i} + {i % 7} =", "completion": f" {i + i % 7}"}) for i in range(n)
    )
    return "".join(row + "\n" for row in rows).encode()


class Procs:
    def __init__(self, root: Path, nats: NatsServer) -> None:
        self.root = root
        self.nats = nats
        self.namespace = "f" + uuid.uuid4().hex[:8]
        self.gateway_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, **extra: str) -> dict[str, str]:
        return (
            dict(os.environ)
            | FAST
            | {
                "SWARM_NATS_URL": self.nats.url,
                "SWARM_NAMESPACE": self.namespace,
                "SWARM_STORE_URL": (self.root / "store").as_uri(),
                "SWARM_WORK_DIR": str(self.root / "work"),
                "SWARM_GATEWAY_PORT": str(self.gateway_port),
                "SWARM_TELEMETRY_PORT": str(free_port()),
            }
            | extra
        )

    def start(self, name: str, service: str, **extra: str) -> subprocess.Popen[bytes]:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the process's
        proc = subprocess.Popen(
            [sys.executable, "-m", f"swarm_{service}"],
            env=self.env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.procs[name].pid, sig)  # the trainer's Ray children too
        if sig == signal.SIGKILL:
            self.procs[name].wait(10)

    def stop_all(self) -> None:
        # Killed, not asked: a graceful stop (a trainer checkpointing and shutting Ray down)
        # costs seconds per process and has tests of its own. Ray's daemons are in the
        # trainer's process group, so they go with it.
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(20)
        if "http" in self.__dict__:
            self.http.close()

    def logs(self) -> str:
        out = []
        for log in sorted((self.root / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-30:]))
        return "\n".join(out)

    # --- through the gateway, like a user ---------------------------------------------------
    @functools.cached_property
    def http(self) -> httpx.Client:
        # One client for the test: a new one per call loads the CA bundle each time (for a
        # plain-HTTP gateway), which was most of the polling loops' CPU. No keep-alive, so a
        # restarted gateway is met on a new connection, as before.
        return httpx.Client(
            base_url=f"http://127.0.0.1:{self.gateway_port}",
            timeout=30,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def wait_gateway(self) -> None:
        for _ in range(300):
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            asyncio.run(asyncio.sleep(0.1))
        raise TimeoutError(self.logs())

    def prepare_inputs(self) -> str:
        """Upload the tiny model and a dataset; return the dataset id."""
        model = create_tiny_model(self.root / "tiny")
        files = [("files", (p.name, p.read_bytes())) for p in model.iterdir() if p.is_file()]
        # The gateway is up before the registry subscribes: 503 until it does, as for a user.
        for _ in range(150):
            r = self.http.post("/v1/models", data={"name": "tiny"}, files=files)
            if r.status_code != 503:
                break
            time.sleep(0.2)
        assert r.status_code < 300, r.text
        r = self.http.post(
            "/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", short_examples(64))}
        )
        assert r.status_code < 300, r.text
        return r.json()["id"]

    def submit(self, dataset: str, key: str, steps: int = 8, **training: int) -> str:
        spec = {
            "name": f"a-{key}",
            "base_model": "tiny",
            "dataset": dataset,
            "training": {"max_steps": steps, "seq_len": 32, "batch_size": 4, "eval_every": 100}
            | training,
        }
        r = self.http.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
        assert r.status_code < 300, r.text
        return r.json()["job_id"]

    def job(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate(self.http.get(f"/v1/jobs/{job_id}").json())

    def wait(self, job_id: str, pred: object, timeout: float = 180) -> JobRecord:
        import time

        deadline = time.monotonic() + timeout
        record = None
        while time.monotonic() < deadline:
            try:
                record = self.job(job_id)
                if pred(record):  # type: ignore[operator]
                    return record
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.3)
        raise AssertionError(f"{job_id} never matched; last {record}\n{self.logs()}")

    def events(self, job_id: str) -> list[dict]:
        """The job's events over SSE, history then until it ends."""
        out = []
        with self.http.stream("GET", f"/v1/jobs/{job_id}/events") as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    out.append(json.loads(line[5:])["data"])
        return out

    def history(self, job_id: str) -> list[dict]:
        """The job's events so far (the SSE stream of a running job never ends by itself)."""
        out: list[dict] = []
        with self.http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=5) as r:
            try:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        out.append(json.loads(line[5:])["data"])
            except httpx.ReadTimeout:  # the history has been sent
                pass
        return out

    def wait_worker(self, worker_id: str, pred: object, timeout: float = 60) -> dict:
        """The worker's entry in the scheduler's worker table once ``pred`` holds for it."""
        import time

        deadline = time.monotonic() + timeout
        worker = None
        while time.monotonic() < deadline:
            workers = self.http.get("/v1/workers").json()["data"]
            worker = next((w for w in workers if w["worker_id"] == worker_id), None)
            if worker is not None and pred(worker):  # type: ignore[operator]
                return worker
            time.sleep(0.5)
        raise AssertionError(f"{worker_id} never matched; last {worker}\n{self.logs()}")

    def adapter_versions(self, name: str) -> list[dict]:
        r = self.http.get("/v1/adapters", params={"name": name})
        r.raise_for_status()
        return r.json()["data"]


def done(record: JobRecord) -> bool:
    return record.state in (JobState.succeeded, JobState.failed, JobState.cancelled)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    server = NatsServer(tmp_path / "nats")
    p = Procs(tmp_path, server)
    try:
        yield p
    finally:
        p.stop_all()
        server.stop()


def start_base(procs: Procs, schedulers: int = 1, **scheduler_env: str) -> str:
    for svc in ("gateway", "registry"):
        procs.start(svc, svc)
    for i in range(schedulers):
        procs.start(f"scheduler{i}", "scheduler", **scheduler_env)
    procs.wait_gateway()
    return procs.prepare_inputs()

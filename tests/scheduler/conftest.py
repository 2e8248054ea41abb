"""A real scheduler and a real registry on the session's nats-server, one namespace per test.

Workers here are played by the test through the public wire contract (heartbeats in,
assignments out, job events back), which is what lets a test decide exactly when a worker
goes silent or reports late.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobRecord, JobSpec
from swarm_contracts.layout import dataset_key
from swarm_contracts.sessions import HeldSession
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Gpu, Heartbeat, HeartbeatState, Resources, RunningJob
from swarm_registry.app import build_app as build_registry
from swarm_runtime.broker import publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_scheduler.app import build_app as build_scheduler
from swarm_scheduler.scheduler import Scheduler
from swarm_scheduler.settings import SchedulerSettings

DATASET_SHA = "ab" * 32
DATASET_ID = dataset_id_for(DATASET_SHA)


def write_fake_model(root: Path, config: dict[str, Any] | None = None) -> None:
    """A config and a one-tensor safetensors file: all the registry inspects."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], **(config or {})}
    (root / "config.json").write_text(json.dumps(config))
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))


async def wait_record(
    jobs: RecordTable[JobRecord], job_id: str, pred: object, timeout: float = 15.0
) -> JobRecord:
    """The job's record once ``pred`` holds for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        found = await jobs.get(job_id)
        if found is not None:
            last = found[0]
            if pred(last):  # type: ignore[operator]
                return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"record of {job_id} never matched; last: {last}")


class Harness:
    def __init__(self, settings: SchedulerSettings, nc: Client) -> None:
        self.settings = settings
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = Subjects(settings.namespace)
        self.scheduler: Scheduler | None = None  # the in-process scheduler, for HA tests

    async def setup(self, tenants: tuple[str, ...] = ("default", "a", "b")) -> None:
        await ensure_topology(self.js, self.subjects)
        self.jobs = RecordTable(await kv_bucket(self.js, self.subjects, "jobs"), JobRecord)
        datasets = RecordTable(await kv_bucket(self.js, self.subjects, "datasets"), DatasetInfo)
        for tenant in tenants:
            await datasets.put(
                f"{tenant}.{DATASET_ID}",
                DatasetInfo(
                    id=DATASET_ID,
                    tenant=tenant,
                    sha256=DATASET_SHA,
                    store_key=dataset_key(tenant, DATASET_SHA),
                    format="text",
                    examples=10,
                    bytes=100,
                ),
            )

    async def register_model(
        self, name: str, tmp_path: Path, config: dict[str, Any] | None = None
    ) -> None:
        write_fake_model(tmp_path / name, config)
        store = open_store(self.settings)
        await asyncio.to_thread(store.upload_dir, tmp_path / name, f"models/{name}/x")
        reply = await self.nc.request(
            self.subjects.registry("models.register"),
            json.dumps({"name": name, "store_key": f"models/{name}/x"}).encode(),
            timeout=10,
        )
        assert json.loads(reply.data)["ok"], reply.data

    def spec(self, **overrides: object) -> dict:
        base = {"name": "adapter", "base_model": "tiny", "dataset": DATASET_ID}
        return JobSpec.model_validate(base | overrides).model_dump(mode="json")

    async def submit(
        self, spec: dict, msg_id: str, job_id: str | None = None, tenant: str = "default"
    ) -> None:
        data = {"spec": spec, "tenant": tenant} | ({"job_id": job_id} if job_id else {})
        event = {
            "specversion": "1.0",
            "id": msg_id,
            "source": "test",
            "type": "swarm.job.submit",
            "data": data,
        }
        await self.js.publish(
            self.subjects.submit, json.dumps(event).encode(), headers={"Nats-Msg-Id": msg_id}
        )

    async def heartbeat(
        self,
        worker_id: str,
        cpus: int = 2,
        running: list[RunningJob] | None = None,
        labels: dict[str, str] | None = None,
        gpus: list[Gpu] | None = None,
        state: HeartbeatState = "alive",
        sessions: list[HeldSession] | None = None,
    ) -> None:
        res = Resources(cpus=cpus, memory_bytes=1 << 30, gpus=gpus or [])
        hb = Heartbeat(
            worker_id=worker_id,
            resources=res,
            free=res,
            running=running or [],
            sessions=sessions or [],
            labels=labels or {},
            state=state,
        )
        await self.nc.publish(
            self.subjects.heartbeat(worker_id),
            envelope("trainer", "swarm.worker.heartbeat", hb).model_dump_json().encode(),
        )

    @contextlib.asynccontextmanager
    async def beating(
        self, worker_id: str, running: Callable[[], list[RunningJob]] = list, **kw: Any
    ) -> AsyncIterator[None]:
        """A worker that keeps heartbeating (listing ``running()``) while the block runs."""

        async def loop() -> None:
            while True:
                await self.heartbeat(worker_id, running=running(), **kw)
                await asyncio.sleep(0.2)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def cancel(self, job_id: str) -> None:
        await self.control("cancel", job_id)

    async def control(self, command: str, job_id: str) -> None:
        """A command about one job (``cancel``, ``pause``, ``resume``) on the control stream,
        as the gateway (or any NATS client) sends it."""
        message = {
            "specversion": "1.0",
            "id": f"{command}-{job_id}",
            "source": "test",
            "type": f"swarm.job.{command}",
            "data": {"job_id": job_id},
        }
        subject = getattr(self.subjects, command)(job_id)
        await self.js.publish(subject, json.dumps(message).encode())

    async def wait_record(self, job_id: str, pred: object, timeout: float = 15.0) -> JobRecord:
        return await wait_record(self.jobs, job_id, pred, timeout)

    async def events(self, job_id: str = "*") -> list[dict]:
        """Every job event stored so far, in order."""
        return await self._read(self.subjects.job_event(job_id))

    async def assignments(self, worker_id: str) -> list[dict]:
        return [e["data"] for e in await self._read(self.subjects.assign(worker_id))]

    async def _read(self, subject: str) -> list[dict]:
        sub = await self.js.subscribe(subject, ordered_consumer=True)
        out = []
        try:
            while True:
                msg = await sub.next_msg(timeout=0.3)
                out.append(json.loads(msg.data))
        except nats.errors.TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out

    async def assignment(self, job_id: str, attempt: int) -> dict | None:
        """The assignment of this attempt (its token: as only its worker knows it)."""
        for a in await self.assignments("*"):
            if a["job_id"] == job_id and a["attempt"] == attempt:
                return a
        return None

    async def attempt_token(self, job_id: str, attempt: int) -> str | None:
        """The token the assignment of this attempt carried (as only its worker knows it)."""
        found = await self.assignment(job_id, attempt)
        return found.get("attempt_token") if found else None

    async def emit(self, event: object, worker_id: str | None = None) -> None:
        """Report a job event as a worker would: on the subject of the worker the attempt was
        assigned to (or ``worker_id``), with its assignment's attempt token."""
        from faststream.nats import NatsBroker

        found = await self.assignment(event.job_id, event.attempt)  # type: ignore[attr-defined]
        token = found.get("attempt_token") if found else None
        worker_id = worker_id or (found or {}).get("worker_id") or "w-unassigned"
        broker = NatsBroker(self.settings.nats_url)
        await broker.connect()
        try:
            await publish_job_event(
                broker,
                self.subjects,
                "trainer",
                event,  # type: ignore[arg-type]
                attempt_token=token,
                worker_id=worker_id,
            )
        finally:
            await broker.stop()


@contextlib.asynccontextmanager
async def running_harness(
    settings: Settings, tmp_path: Path, **overrides: Any
) -> AsyncIterator[Harness]:
    """A registry and a scheduler with ``overrides`` applied to the test settings."""
    defaults: dict[str, Any] = {"worker_timeout_s": 1.5, "max_attempts": 2}
    settings = SchedulerSettings.of(settings, **(defaults | overrides))
    nc = await nats.connect(settings.nats_url)
    h = Harness(settings, nc)
    await h.setup()
    try:
        scheduler_app = build_scheduler(settings)
        async with build_registry(settings), scheduler_app:
            h.scheduler = scheduler_app.context.get("scheduler")
            await h.register_model("tiny", tmp_path)
            yield h
    finally:
        await nc.close()


@pytest.fixture
async def harness(settings: Settings, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_harness(settings, tmp_path) as h:
        yield h

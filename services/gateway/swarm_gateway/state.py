"""What every request handler needs: the NATS connection, KV tables, the object store."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import nats.errors
from fastapi import Request
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import Error as JetStreamError
from opentelemetry.trace import NoOpTracer, Tracer

from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.jobs import JobRecord
from swarm_contracts.subjects import Subjects
from swarm_contracts.sweeps import SweepRecord, TrialRecord
from swarm_contracts.workers import WorkerInfo, WorkerOps
from swarm_gateway.fine_tune_records import FineTune
from swarm_gateway.inference_workers import InferenceWorkers
from swarm_gateway.prometheus import GatewayMetrics
from swarm_gateway.settings import GatewaySettings
from swarm_runtime.record_cache import RecordCache
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import ServiceClient, Unavailable
from swarm_runtime.store import ObjectStore


@dataclass
class Gateway:
    settings: GatewaySettings
    subjects: Subjects
    broker: NatsBroker
    nc: NatsClient
    js: JetStreamContext
    jobs: RecordTable[JobRecord]
    datasets: RecordTable[DatasetInfo]
    workers: RecordTable[WorkerInfo]
    worker_ops: RecordTable[WorkerOps]
    sweeps: RecordTable[SweepRecord]
    trials: RecordTable[TrialRecord]
    store: ObjectStore
    # How long POST /v1/jobs waits for the scheduler to create the record before answering 202.
    submit_wait_s: float = 5.0
    # Registry/telemetry request timeout.
    request_timeout_s: float = 5.0
    # An SSE stream ends after this long when idle (None: when the job ends); the client
    # reconnects with Last-Event-ID. Bounds what a proxy or a test holds open.
    event_stream_max_s: float | None = None
    metrics: GatewayMetrics | None = None
    tracer: Tracer = field(default_factory=NoOpTracer)
    # The services behind the gateway; their refusals and outages become HTTP statuses in one
    # place (swarm_gateway.errors).
    registry: ServiceClient = field(init=False)
    telemetry: ServiceClient = field(init=False)
    trainer: ServiceClient = field(init=False)
    scheduler: ServiceClient = field(init=False)

    def __post_init__(self) -> None:
        timeout = self.request_timeout_s
        self.registry = ServiceClient(self.nc, "registry", self.subjects.registry, timeout)
        self.telemetry = ServiceClient(self.nc, "telemetry", self.subjects.telemetry, timeout)
        self.trainer = ServiceClient(self.nc, "trainer", self.subjects.trainer, timeout)
        self.scheduler = ServiceClient(self.nc, "scheduler", self.subjects.scheduler, timeout)

    # The inference workers' latest heartbeats (GET /v1/models says what is served).
    inference_workers: InferenceWorkers | None = None
    # The jobs bucket in memory, for listings (without it, each listing reads the bucket).
    job_list: RecordCache[JobRecord] | None = None
    # What the OpenAI fine-tuning jobs add to their Swarm jobs (swarm_gateway.fine_tune_records),
    # with its copy in memory for listings.
    fine_tunes: RecordTable[FineTune] | None = None
    fine_tune_list: RecordCache[FineTune] | None = None
    # Uploads validated in the background (swarm_gateway.dataset_upload), and their tasks.
    dataset_uploads: RecordTable[DatasetUpload] | None = None
    background: set[asyncio.Task[None]] = field(default_factory=set)

    async def all_jobs(self) -> list[JobRecord]:
        return await (self.job_list or self.jobs).all()

    async def recent_job(self, job_id: str) -> JobRecord | None:
        """The job's record, possibly milliseconds old (from the listing's copy)."""
        if self.job_list is not None:
            return self.job_list.peek(job_id)
        found = await self.jobs.get(job_id)
        return found[0] if found is not None else None

    async def publish(
        self, subject: str, body: bytes, stream: str, headers: dict[str, str]
    ) -> PubAck:
        """A JetStream command (submit, cancel): acked by its stream, or ``Unavailable`` with
        the reason, never an unexpected exception (a 500). An ack that is not the stream's
        (a stray answer on the reply subject) counts as no ack: the caller may retry, and a
        retry with the same ``Nats-Msg-Id`` is de-duplicated by the stream."""
        try:
            return await self.js.publish(subject, body, stream=stream, headers=headers)
        except (nats.errors.Error, JetStreamError, ValueError, KeyError, TypeError) as exc:
            # ValueError covers a JSONDecodeError on an ack that is not JSON.
            raise Unavailable("NATS", f"publishing to {subject} failed: {exc!r}") from exc


def get_gateway(request: Request) -> Gateway:
    """The gateway's connections, for a handler that talks to NATS: while NATS is away (the
    client reconnects for ever) every such request is a 503 at once, with the reason, rather
    than a KV read or publish that hangs until its timeout."""
    gw: Gateway = request.app.state.gateway
    if not gw.nc.is_connected:
        state = "closed" if gw.nc.is_closed else "reconnecting"
        raise Unavailable("NATS", f"the gateway is not connected to NATS ({state})")
    return gw

"""What every request handler needs: the NATS connection, KV tables, the object store."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from opentelemetry.trace import NoOpTracer, Tracer

from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobRecord
from swarm_common.records import RecordTable
from swarm_common.settings import Settings
from swarm_common.store import ObjectStore
from swarm_common.subjects import Subjects
from swarm_common.workers import WorkerInfo
from swarm_gateway.prometheus import GatewayMetrics


@dataclass
class Gateway:
    settings: Settings
    subjects: Subjects
    broker: NatsBroker
    nc: NatsClient
    js: JetStreamContext
    jobs: RecordTable[JobRecord]
    datasets: RecordTable[DatasetInfo]
    workers: RecordTable[WorkerInfo]
    store: ObjectStore
    # How long POST /v1/jobs waits for the scheduler to create the record before answering 202.
    submit_wait_s: float = 5.0
    # Registry/telemetry request timeout.
    request_timeout_s: float = 5.0
    metrics: GatewayMetrics | None = None
    tracer: Tracer = field(default_factory=NoOpTracer)


def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway

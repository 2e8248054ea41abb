"""One trace per job: the W3C trace context helpers, and the span chain of one real job run
through the real gateway, scheduler, trainer (with Ray) and registry, all in this process so
that an in-memory exporter sees their spans. (The Ray workers are other processes: the trainer
agent makes the phase spans from their reports, see swarm_trainer.job_trace.)"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from swarm_contracts.jobs import JobState
from swarm_runtime.settings import Settings
from swarm_runtime.tracing import child_span, context_from, setup_tracing, traceparent

from ..conftest import ServerThread


def test_traceparent_round_trip_and_bad_input() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(Settings(), "test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    assert traceparent() is None  # no current span
    assert context_from(None) is None
    assert context_from("garbage") is None

    with tracer.start_as_current_span("root") as root:
        stored = traceparent()
    assert stored is not None
    assert stored.startswith("00-")
    # Later, elsewhere: a span continuing the stored trace.
    with child_span(tracer, "later", stored, **{"swarm.job_id": "job-1"}):
        pass
    with child_span(tracer, "fresh", None):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    ctx = root.get_span_context()
    assert spans["later"].context.trace_id == ctx.trace_id
    assert spans["later"].parent is not None
    assert spans["later"].parent.span_id == ctx.span_id
    assert spans["later"].attributes["swarm.job_id"] == "job-1"
    assert spans["fresh"].parent is None
    assert spans["fresh"].context.trace_id != ctx.trace_id
    assert spans["root"].resource.attributes["service.name"] == "swarm-test"


# --- one real job ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    from swarm_trainer import own_ray

    started = not ray.is_initialized()
    if started:
        own_ray.start(2, worker_logs=False)
    yield
    if started:
        own_ray.stop()


def collect(exporter: InMemorySpanExporter, *providers: TracerProvider) -> None:
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(exporter))


async def spans_when(
    exporter: InMemorySpanExporter, name: str, timeout: float = 30
) -> list[ReadableSpan]:
    """All finished spans, once one named ``name`` has ended."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        spans = list(exporter.get_finished_spans())
        if any(s.name == name for s in spans):
            return spans
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {name} span; got {[s.name for s in exporter.get_finished_spans()]}")


@pytest.mark.slow
async def test_one_job_is_one_trace_from_gateway_to_registry(
    settings: Settings, tmp_path: Path, ray_local: None
) -> None:
    from swarm.client import Client
    from swarm.demo_data import write_demo_datasets
    from swarm_gateway import create_app
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_trainer.app import build_app as build_trainer
    from swarm_trainer.settings import TrainerSettings
    from swarm_trainer.tiny_model import create_tiny_model

    settings = TrainerSettings.of(
        settings, worker_id="w-trace", heartbeat_interval_s=0.5, trainer_cpus=2
    )
    registry, scheduler, trainer = (
        build_registry(settings),
        build_scheduler(settings),
        build_trainer(settings),
    )
    gateway = create_app(settings)
    exporter = InMemorySpanExporter()
    collect(
        exporter,
        gateway.state.tracer_provider,
        *(app.context.get("tracer_provider") for app in (registry, scheduler, trainer)),
    )
    model_dir = create_tiny_model(tmp_path / "tiny-llama")
    train, val = write_demo_datasets(tmp_path / "data", n_train=32, n_val=8)

    async with registry, scheduler, trainer:
        with ServerThread(gateway) as gw, Client(base_url=gw.url) as client:

            def submit_and_wait() -> Any:
                client.add_model("tiny-llama", model_dir)
                spec = {
                    "name": "traced",
                    "base_model": "tiny-llama",
                    "dataset": client.upload_dataset(train).id,
                    "validation": client.upload_dataset(val).id,
                    "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]},
                    "training": {
                        "max_steps": 4,
                        "batch_size": 4,
                        "seq_len": 64,
                        "warmup_steps": 1,
                        "eval_every": 2,
                        "checkpoint_every": 2,
                    },
                }
                job = client.submit(spec, idempotency_key="traced-1")
                return client.wait(job.job_id, timeout=300)

            record = await asyncio.to_thread(submit_and_wait)
            assert record.state == JobState.succeeded, record.reason
            spans = await spans_when(exporter, "trainer.job")

    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)

    def one(name: str) -> ReadableSpan:
        found = by_name.get(name, [])
        assert len(found) == 1, f"{name}: {len(found)} spans; all: {sorted(by_name)}"
        return found[0]

    def parent_of(span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, f"{span.name} has no parent"
        matches = [s for s in spans if s.context.span_id == span.parent.span_id]
        assert matches, f"the parent of {span.name} was not exported"
        return matches[0]

    submit = one("gateway.submit")
    assert submit.parent is None, "the job's trace starts at the gateway"
    trace_id = submit.context.trace_id
    job_spans = [s for s in spans if s.context.trace_id == trace_id]

    # gateway -> scheduler -> trainer -> registry, each link a real parent/child.
    chain = ["gateway.submit", "scheduler.submit", "scheduler.place", "trainer.job"]
    for parent, child in itertools.pairwise(chain):
        assert parent_of(one(child)).name == parent, child
    job = one("trainer.job")
    for phase in ("trainer.setup", "trainer.train", "trainer.save", "trainer.register"):
        assert parent_of(one(phase)).name == "trainer.job", phase
    train_span = one("trainer.train")
    for name in ("trainer.validate", "trainer.checkpoint_upload"):
        steps = sorted(s.attributes["swarm.step"] for s in by_name[name])
        assert steps == [2, 4], name
        assert all(parent_of(s) is train_span for s in by_name[name])
    registration = one("registry.register_adapter")
    assert registration.attributes["swarm.adapter_version"] == 1
    # The registry's request span (FastStream's middleware) sits between the two services.
    request_span = parent_of(registration)
    assert request_span.resource.attributes["service.name"] == "swarm-registry"
    assert parent_of(request_span).name == "trainer.register"

    named = [
        *chain,
        "trainer.setup",
        "trainer.train",
        "trainer.validate",
        "trainer.checkpoint_upload",
        "trainer.save",
        "trainer.register",
        "registry.register_adapter",
    ]
    assert {s.name for s in job_spans} >= set(named)
    assert all(s.context.trace_id == trace_id for s in spans if s.name in named)
    services = {s.resource.attributes["service.name"] for s in job_spans}
    assert services == {"swarm-gateway", "swarm-scheduler", "swarm-trainer", "swarm-registry"}
    # The phases, timed in the Ray worker, follow each other inside the job's span.
    setup, save = one("trainer.setup"), one("trainer.save")
    assert job.start_time <= setup.start_time <= setup.end_time <= train_span.start_time
    assert train_span.end_time <= save.start_time <= save.end_time <= job.end_time
    assert [e.name for e in job.events][-1] == "swarm.job.succeeded"

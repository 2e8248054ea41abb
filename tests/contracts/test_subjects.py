"""Subject, stream and bucket names: the empty namespace gives exactly the public contract."""

from __future__ import annotations

import pytest

from swarm_contracts.events import JOB_EVENTS, TERMINAL_EVENTS
from swarm_contracts.subjects import Subjects


def test_contract_names_with_empty_namespace() -> None:
    s = Subjects()
    assert s == Subjects("")
    assert s.submit == "swarm.jobs.submit"
    assert s.cancel("job-1") == "swarm.jobs.job-1.cancel"
    assert s.cancel() == "swarm.jobs.*.cancel"
    assert s.verify("job-1") == "swarm.jobs.job-1.verify"
    assert s.job_event("job-1", "queued") == "swarm.jobs.job-1.events.queued"
    assert s.job_event() == "swarm.jobs.*.events.*"
    assert s.job_event("job-1", ">") == "swarm.jobs.job-1.events.>"
    assert s.heartbeat("w1") == "swarm.workers.w1.heartbeat"
    assert s.heartbeat() == "swarm.workers.*.heartbeat"
    assert s.assign("w1") == "swarm.workers.w1.assign"
    assert s.assign() == "swarm.workers.*.assign"
    assert s.adapter_registered("support-bot") == "swarm.adapters.support-bot.registered"
    assert s.adapter_registered() == "swarm.adapters.*.registered"
    assert s.dead_letter("gateway") == "swarm.dlq.gateway"
    assert s.dead_letter() == "swarm.dlq.*"
    assert s.registry("models.get") == "swarm.registry.models.get"
    assert s.telemetry("metrics.get") == "swarm.telemetry.metrics.get"
    assert s.inference_generate("tiny-llama", 2) == "swarm.inference.tiny-llama.2.generate"
    assert s.inference_generate() == "swarm.inference.*.*.generate"
    assert s.inference_heartbeat("i1") == "swarm.inference.workers.i1.heartbeat"
    assert s.inference_heartbeat() == "swarm.inference.workers.*.heartbeat"
    assert s.inference_cancel("r1") == "swarm.inference.requests.r1.cancel"
    # A worker's own subjects: the sender is in the subject.
    assert s.worker_event("w1", "job-1", "started") == "swarm.workers.w1.events.job-1.started"
    assert s.worker_event() == "swarm.workers.*.events.*.*"
    assert s.worker_registry("store.access", "w1") == "swarm.workers.w1.registry.store.access"
    assert s.worker_registry("adapters.register") == "swarm.workers.*.registry.adapters.register"
    assert s.worker_attempt("w1") == "swarm.workers.w1.attempt"
    assert s.worker_events_stream == "SWARM_WORKER_EVENTS"
    assert Subjects.service_inbox("gateway") == "_INBOX.svc.gateway"
    assert Subjects.worker_inbox("acme") == "_INBOX.worker.acme"


def test_the_sender_of_a_worker_subject() -> None:
    for s in (Subjects(), Subjects("abc")):
        assert Subjects.worker_of(s.worker_event("w1", "job-1", "failed")) == "w1"
        assert Subjects.worker_of(s.worker_registry("store.access", "acme")) == "acme"
        assert Subjects.worker_of(s.heartbeat("w-2")) == "w-2"
        assert Subjects.worker_of(s.job_event("job-1", "failed")) is None


def test_contract_stream_and_bucket_names() -> None:
    s = Subjects()
    assert s.submit_stream == "SWARM_SUBMIT"
    assert s.events_stream == "SWARM_EVENTS"
    assert s.control_stream == "SWARM_CONTROL"
    assert s.assign_stream == "SWARM_ASSIGN"
    assert s.adapters_stream == "SWARM_ADAPTERS"
    assert s.dead_letter_stream == "SWARM_DLQ"
    for name in ("jobs", "workers", "datasets", "models", "adapters"):
        assert s.bucket(name) == f"swarm_{name}"


def test_namespace_prefixes_subjects() -> None:
    s = Subjects("abc")
    assert s.submit == "abc.swarm.jobs.submit"
    assert s.cancel("j") == "abc.swarm.jobs.j.cancel"
    assert s.job_event("j", "started") == "abc.swarm.jobs.j.events.started"
    assert s.job_event() == "abc.swarm.jobs.*.events.*"
    assert s.heartbeat("w") == "abc.swarm.workers.w.heartbeat"
    assert s.assign("w") == "abc.swarm.workers.w.assign"
    assert s.adapter_registered("n") == "abc.swarm.adapters.n.registered"
    assert s.dead_letter("x") == "abc.swarm.dlq.x"
    assert s.registry("adapters.list") == "abc.swarm.registry.adapters.list"
    assert s.telemetry("metrics.get") == "abc.swarm.telemetry.metrics.get"
    assert s.inference_generate("m", 1) == "abc.swarm.inference.m.1.generate"
    assert s.inference_heartbeat("w") == "abc.swarm.inference.workers.w.heartbeat"


def test_namespace_prefixes_streams_and_buckets() -> None:
    s = Subjects("abc")
    assert s.submit_stream == "ABC_SWARM_SUBMIT"
    assert s.events_stream == "ABC_SWARM_EVENTS"
    assert s.dead_letter_stream == "ABC_SWARM_DLQ"
    assert s.bucket("jobs") == "ABC_swarm_jobs"
    # '-' is legal in a namespace but not in a stream name.
    d = Subjects("t-1")
    assert d.events_stream == "T_1_SWARM_EVENTS"
    assert d.bucket("workers") == "T_1_swarm_workers"
    assert d.submit == "t-1.swarm.jobs.submit"


@pytest.mark.parametrize("namespace", ["", "abc", "t0123456789", "a-b_c"])
def test_names_are_valid_nats_tokens(namespace: str) -> None:
    s = Subjects(namespace)
    streams = [
        s.submit_stream,
        s.events_stream,
        s.control_stream,
        s.assign_stream,
        s.adapters_stream,
        s.dead_letter_stream,
    ]
    for name in [*streams, *(s.bucket(b) for b in ("jobs", "workers"))]:
        assert name.replace("_", "").isalnum(), name
    # Distinct namespaces never share a name.
    other = Subjects(namespace + "x")
    assert s.submit != other.submit
    assert s.events_stream != other.events_stream


def test_event_names() -> None:
    assert set(TERMINAL_EVENTS) <= set(JOB_EVENTS)
    assert JOB_EVENTS == (
        "queued",
        "assigned",
        "started",
        "progress",
        "checkpoint",
        "validated",
        "requeued",
        "released",
        "paused",
        "resumed",
        "succeeded",
        "failed",
        "cancelled",
        "replayed",
        "verified",
    )


def test_subjects_is_immutable() -> None:
    s = Subjects("abc")
    with pytest.raises(AttributeError):
        s.namespace = "other"  # type: ignore[misc]

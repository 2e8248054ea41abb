"""The CloudEvents 1.0 structured envelope (contract)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from pydantic import ValidationError

from swarm_contracts.envelope import CloudEvent, envelope
from swarm_contracts.events import Failed, Progress
from swarm_contracts.jobs import job_id_for

JOB = job_id_for("t", "k")


def test_envelope_fields() -> None:
    ev = envelope(
        "trainer",
        "swarm.job.progress",
        Progress(
            job_id=JOB, attempt=1, step=3, max_steps=10, loss=1.5, lr=1e-4, tokens_per_s=100.0
        ),
        subject=JOB,
    )
    assert ev.specversion == "1.0"
    assert ev.source == "swarm/trainer"
    assert ev.type == "swarm.job.progress"
    assert ev.subject == JOB
    assert ev.datacontenttype == "application/json"
    assert isinstance(ev.time, datetime)
    assert ev.time.tzinfo is not None
    assert ev.id
    assert isinstance(ev.id, str)
    other = envelope("trainer", "swarm.job.progress", ev.data, subject=JOB)
    assert other.id != ev.id  # every event gets its own id


def test_round_trip_through_json() -> None:
    data = Failed(job_id=JOB, attempt=2, reason="out of memory")
    ev = envelope("scheduler", "swarm.job.failed", data, subject=JOB)
    wire = ev.model_dump_json()
    raw = json.loads(wire)
    # A plain client sees the documented structured envelope.
    assert set(raw) == {
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "subject",
        "datacontenttype",
        "data",
    }
    assert raw["specversion"] == "1.0"
    assert raw["data"] == {
        "event": "failed",
        "job_id": JOB,
        "attempt": 2,
        "reason": "out of memory",
    }
    datetime.fromisoformat(raw["time"])  # RFC 3339 / ISO 8601

    back = CloudEvent[Failed].model_validate_json(wire)
    assert back == ev
    assert isinstance(back.data, Failed)
    assert back.data.reason == "out of memory"


def test_foreign_producer_message_parses() -> None:
    """A message written by hand (a plain NATS client) with only the required fields."""
    wire = json.dumps(
        {
            "specversion": "1.0",
            "id": "abc",
            "source": "other/system",
            "type": "swarm.job.failed",
            "data": {"event": "failed", "job_id": JOB, "reason": "x"},
        }
    )
    ev = CloudEvent[Failed].model_validate_json(wire)
    assert ev.data.attempt == 0
    assert ev.subject is None
    assert ev.datacontenttype == "application/json"


@pytest.mark.parametrize("missing", ["source", "type", "data"])
def test_required_fields(missing: str) -> None:
    raw = {
        "specversion": "1.0",
        "source": "swarm/x",
        "type": "swarm.job.failed",
        "data": {"event": "failed", "job_id": JOB, "reason": "x"},
    }
    del raw[missing]
    with pytest.raises(ValidationError):
        CloudEvent[Failed].model_validate(raw)


@pytest.mark.parametrize(
    ("field", "value"), [("specversion", "0.3"), ("datacontenttype", "text/plain")]
)
def test_fixed_fields(field: str, value: str) -> None:
    raw = {
        "source": "swarm/x",
        "type": "swarm.job.failed",
        "data": {"event": "failed", "job_id": JOB, "reason": "x"},
        field: value,
    }
    with pytest.raises(ValidationError):
        CloudEvent[Failed].model_validate(raw)


def test_data_is_validated() -> None:
    raw = {"source": "swarm/x", "type": "swarm.job.failed", "data": {"job_id": JOB}}
    with pytest.raises(ValidationError):
        CloudEvent[Failed].model_validate(raw)

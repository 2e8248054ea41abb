"""What each job event means is on its class, and every set of event names comes from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swarm_contracts import events
from swarm_contracts.events import (
    JOB_EVENT_CLASSES,
    JOB_EVENTS,
    MEANINGS,
    TERMINAL_EVENTS,
    JobEvent,
    job_lifecycle,
    sent_by,
    sent_by_worker,
)
from swarm_contracts.jobs import JobState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def _all_subclasses(cls: type[JobEvent]) -> set[type[JobEvent]]:
    found = set(cls.__subclasses__())
    return found.union(*(_all_subclasses(c) for c in found))


def test_every_event_class_is_in_the_union_with_its_own_meaning() -> None:
    # Defined in the contracts (a test's own subclass, below, is not an event of the contract).
    classes = {c for c in _all_subclasses(JobEvent) if c.__module__ == events.__name__}
    assert classes == set(JOB_EVENT_CLASSES), "an event class missing from AnyJobEvent"
    for cls in classes:
        assert "meaning" in cls.__dict__, cls
        assert cls.meaning.origin, f"{cls.__name__}: nobody sends it"
    assert len(JOB_EVENTS) == len(set(JOB_EVENTS)), "two classes share a name"


def test_an_event_class_without_a_meaning_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match="must say what it means"):

        class Paused(JobEvent):
            event: str = "paused"


def test_the_sets_derived_from_the_meanings() -> None:
    assert {"succeeded", "failed", "cancelled", "replayed"} == TERMINAL_EVENTS
    assert {n for n, m in MEANINGS.items() if "worker" not in m.origin} == {
        "queued",
        "assigned",
        "requeued",
        "paused",
        "resumed",
        "verified",
    }
    # An event is final exactly when the state it leaves is.
    for name, meaning in MEANINGS.items():
        assert meaning.terminal == (name in TERMINAL_EVENTS)
        if meaning.state_after is not None:
            assert meaning.terminal == meaning.state_after.terminal
    # A replay job ends with `replayed`, which leaves it succeeded (it registers no adapter).
    assert MEANINGS["replayed"].state_after == JobState.succeeded


def test_who_may_send_an_event() -> None:
    assert sent_by_worker(events.Started(job_id="j", worker_id="w"))
    assert sent_by_worker(events.Failed(job_id="j", reason="oom"))
    assert not sent_by_worker(events.Requeued(job_id="j", reason="lost"))
    assert not sent_by_worker(events.Assigned(job_id="j", worker_id="w"))
    assert sent_by("scheduler", leaves=None).terminal is False


def test_the_lifecycle_lists_every_state_and_event_with_its_meaning() -> None:
    life = job_lifecycle().model_dump(mode="json")
    assert [s["name"] for s in life["states"]] == [s.value for s in JobState]
    assert {s["name"] for s in life["states"] if s["terminal"]} == {
        s.value for s in JobState if s.terminal
    }
    assert list(life["events"]) == list(JOB_EVENTS)
    assert life["events"]["cancelled"] == {
        "origin": ["worker", "scheduler"],
        "state_after": "cancelled",
        "terminal": True,
    }
    assert life["events"]["released"]["state_after"] is None


def test_the_docs_table_of_job_events_says_who_sends_each() -> None:
    text = DOCS.read_text()
    section = text[text.index("## Job events") : text.index("## Sweeps")]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", section, re.MULTILINE))
    assert list(rows) == list(JOB_EVENTS), "docs/events.md lists other job events"
    for name, emitted_by in rows.items():
        named = re.findall(r"scheduler|trainer", emitted_by)
        said = {"worker" if w == "trainer" else w for w in named}
        assert said == set(MEANINGS[name].origin), (name, emitted_by)

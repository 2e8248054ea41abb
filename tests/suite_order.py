"""How `make test` shares the suite between its two xdist workers.

Whole files go to a worker (a file's module fixtures start once), except the directories whose
tests share one session-wide stack of services (``GROUPED``): such a directory goes to one
worker whole, so its stack starts once, not on both. Work goes out longest first, by each
file's time in a recent run (``durations.json``): what is left at the end are short files, so
neither worker sits alone with minutes of work while the other has none (the longest-first
rule for two machines). A file not in the record counts by its marks.

Refresh the record after adding heavy tests: ``.venv/bin/pytest -n 2 --dist loadfile
--record-durations`` (the summed call, setup and teardown times per file).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).with_name("durations.json")
GROUPED = ("tests/e2e/", "tests/dashboard/")


def scope_of(nodeid: str) -> str:
    """The unit of work a test goes out in: its file, or its directory where that is grouped."""
    path = nodeid.split("::", 1)[0]
    return next((group for group in GROUPED if path.startswith(group)), path)


class SuiteScheduling(LoadScopeScheduling):
    """xdist's file-by-file scheduling with ``scope_of``'s units, in the collection's order."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def _guess(item: pytest.Item) -> float:
    """Seconds for a test of a file with no record: by its marks (a multi-process fault test
    has a long timeout; ``slow`` trains a model or runs a stack)."""
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args and timeout.args[0] >= 900:
        return 60.0
    return 8.0 if item.get_closest_marker("slow") is not None else 0.5


def order(items: list[pytest.Item]) -> None:
    """Sort ``items`` so their units go out longest first (stable within a unit)."""
    recorded: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds: dict[str, float] = defaultdict(float)
    guessed: dict[str, float] = defaultdict(float)
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path not in recorded:
            guessed[path] += _guess(item)
    for path in {item.nodeid.split("::", 1)[0] for item in items}:
        seconds[scope_of(path)] += recorded.get(path, guessed[path])
    items.sort(key=lambda item: -seconds[scope_of(item.nodeid)])


class DurationRecorder:
    """``--record-durations``: each file's summed test times, into the record at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self) -> None:
        # The files this run ran replace their entries; the others' stay.
        recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        recorded |= {path: round(s, 1) for path, s in self.seconds.items()}
        DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")

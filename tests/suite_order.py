"""How `make test` shares the suite between its xdist workers.

Whole files go to a worker (a file's module fixtures start once), except the directories whose
tests share one session-wide stack of services (``GROUPED``): such a directory goes to one
worker whole, so its stack starts once, not on two. Work goes out longest first, by each
file's time in a recent run (``durations.json``): what is left at the end are short files, so
no worker sits alone with minutes of work while the others have none (the longest-first
rule). A file not in the record counts by its marks.

Three workers on two cores, but never more than two heavy units at once (``HEAVY_AT_ONCE``):
a heavy unit (a file with a ``slow`` test: it trains, or runs services and Ray as processes)
keeps a core busy, while most light files wait on timeouts, leases and sockets. Two workers
alone left a quarter of the CPU idle whenever both sat in such waits; three heavy units at once
overloaded the machine (the multi-process fault tests' timeouts are sized for two).

Refresh the record after adding heavy tests: ``.venv/bin/pytest -n 3 --dist loadfile
--record-durations`` (the summed call, setup and teardown times per file).
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).with_name("durations.json")
GROUPED = ("tests/e2e/", "tests/dashboard/")
HEAVY_AT_ONCE = 2
ROOT = Path(__file__).parent.parent


def scope_of(nodeid: str) -> str:
    """The unit of work a test goes out in: its file, or its directory where that is grouped."""
    path = nodeid.split("::", 1)[0]
    return next((group for group in GROUPED if path.startswith(group)), path)


@functools.cache
def is_heavy(scope: str) -> bool:
    """Whether a unit holds a ``slow`` test (read from its files: the scheduler runs in the
    controller, which collects nothing)."""
    paths = sorted((ROOT / scope).rglob("test_*.py")) if scope.endswith("/") else [ROOT / scope]
    return any("mark.slow" in p.read_text() for p in paths if p.is_file())


class SuiteScheduling(LoadScopeScheduling):
    """xdist's file-by-file scheduling with ``scope_of``'s units, in the collection's order,
    and at most ``HEAVY_AT_ONCE`` workers in heavy units at any time."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _in_heavy(self, node: WorkerController) -> bool:
        return any(
            is_heavy(scope) and not all(unit.values())
            for scope, unit in self.assigned_work.get(node, {}).items()
        )

    def _next_scope(self, node: WorkerController) -> str | None:
        """The first unit in the queue this node may take now, if any."""
        busy = sum(self._in_heavy(other) for other in self.nodes if other is not node)
        if self._in_heavy(node) or busy < HEAVY_AT_ONCE:
            return next(iter(self.workqueue), None)
        return next((scope for scope in self.workqueue if not is_heavy(scope)), None)

    def _assign_work_unit(self, node: WorkerController) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return  # only heavy units are left, and two workers run one: later
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node: WorkerController) -> None:
        # Only heavy units left and none for this node now: it waits, not shuts down.
        if self.workqueue and self._next_scope(node) is None:
            return
        super()._reschedule(node)

    def mark_test_complete(
        self, node: WorkerController, item_index: int, duration: float = 0
    ) -> None:
        super().mark_test_complete(node, item_index, duration)
        # A heavy unit done frees its place for a waiting worker too.
        for other in self.nodes:
            if other is not node:
                self._reschedule(other)


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

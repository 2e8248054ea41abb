"""Checking stored adapter files against the sha256 recorded when they were registered."""

from __future__ import annotations

from swarm_contracts.layout import join_key
from swarm_contracts.registry import AdapterVersion, VerifyReport
from swarm_runtime.store import NotFound, ObjectStore


def verify(store: ObjectStore, record: AdapterVersion) -> VerifyReport:
    """Re-hash every file of a version (sync: call it in a thread)."""
    corrupted, missing = [], []
    for name, expected in sorted(record.files.items()):
        try:
            actual = store.sha256(join_key(record.store_key, name))
        except NotFound:
            missing.append(name)
            continue
        if actual != expected:
            corrupted.append(name)
    return VerifyReport(
        name=record.name,
        version=record.version,
        store_key=record.store_key,
        ok=not corrupted and not missing,
        corrupted=corrupted,
        missing=missing,
    )

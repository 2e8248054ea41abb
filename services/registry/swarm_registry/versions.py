"""Version numbers in a KV bucket: keys ``<name>.<version>`` and a ``<name>.latest`` counter
(``name`` is ``<tenant>.<adapter>`` for adapters, numbered per tenant).

The counter is a plain decimal number changed only by compare-and-set, so two registries (or
two concurrent requests in one) can never hand out the same version.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Generic, TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from swarm_contracts import names
from swarm_registry.errors import RegistryError
from swarm_runtime.records import Conflict, RecordTable

M = TypeVar("M", bound=BaseModel)

# ``name`` may be scoped by one token (``<tenant>.<name>``: adapters are numbered per tenant).
_VERSION_KEY = re.compile(
    r"^(?P<name>(?:[a-z0-9][a-z0-9_-]*\.)?[a-z0-9][a-z0-9_-]*)\.(?P<version>[0-9]+)$"
)
CAS_RETRIES = 100


def check_name(name: str, what: str = "name") -> str:
    # Names become KV key tokens and store-key segments: the contracts' one naming rule.
    try:
        return names.check_name(name, what)
    except ValueError as exc:
        raise RegistryError(f"invalid {exc}") from exc


def scoped(tenant: str, name: str) -> str:
    """The versioned name of a tenant's adapter: numbers are per tenant, so that bob's first
    ``alice-bot`` is v1 whether or not alice has one (a shared counter would tell bob)."""
    return f"{tenant}.{name}"


def unscoped(scoped_name: str) -> tuple[str, str]:
    """(tenant, name) of a versioned name."""
    tenant, _, name = scoped_name.partition(".")
    return tenant, name


def version_key(name: str, version: int) -> str:
    return f"{name}.{version}"


def latest_key(name: str) -> str:
    return f"{name}.latest"


def parse_version_key(key: str) -> tuple[str, int] | None:
    """(name, version) for a record key; None for counters and index entries."""
    match = _VERSION_KEY.match(key)
    return (match["name"], int(match["version"])) if match else None


async def read_int(kv: KeyValue, key: str) -> tuple[int, int] | None:
    """(value, revision) of a decimal counter or index entry, or None if absent."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.revision is None or entry.operation in ("DEL", "PURGE"):
        return None
    return int(entry.value.decode()), entry.revision


async def increment(kv: KeyValue, key: str) -> int:
    """Add one to the counter at ``key`` by compare-and-set and return the new value."""
    for _ in range(CAS_RETRIES):
        current = await read_int(kv, key)
        value = (current[0] if current else 0) + 1
        try:
            if current is None:
                await kv.create(key, str(value).encode())
            else:
                await kv.update(key, str(value).encode(), last=current[1])
            return value
        except KeyWrongLastSequenceError:
            continue
    raise RegistryError(f"{key}: too many concurrent registrations, try again", "conflict")


async def raise_to(kv: KeyValue, key: str, value: int) -> None:
    """Move the counter up to ``value`` unless it is already there or beyond."""
    for _ in range(CAS_RETRIES):
        current = await read_int(kv, key)
        if current is not None and current[0] >= value:
            return
        try:
            if current is None:
                await kv.create(key, str(value).encode())
            else:
                await kv.update(key, str(value).encode(), last=current[1])
            return
        except KeyWrongLastSequenceError:
            continue


class Versions(Generic[M]):
    """The versioned records of one bucket."""

    def __init__(self, kv: KeyValue, model: type[M]) -> None:
        self.kv = kv
        self.table: RecordTable[M] = RecordTable(kv, model)

    async def get(self, name: str, version: int) -> M | None:
        found = await self.table.get(version_key(name, version))
        return found[0] if found else None

    async def create(self, name: str, version: int, record: M) -> bool:
        """Write a new version; False if that version exists already."""
        try:
            await self.table.create(version_key(name, version), record)
            return True
        except Conflict:
            return False

    async def newest(self, name: str) -> list[int]:
        """Candidate version numbers, newest first, starting from the counter.

        A version can be missing below the counter (a registration reserved it and is still
        copying, or died) and, for counters bumped after the write, present above it; both are
        covered by probing up first and then walking down.
        """
        hint = await read_int(self.kv, latest_key(name))
        top = hint[0] if hint else 0
        while await self.table.get(version_key(name, top + 1)) is not None:
            top += 1
        return list(range(top, 0, -1))

    async def latest(self, name: str, accept: Callable[[M], bool] | None = None) -> M | None:
        """The newest version (that ``accept`` accepts, if given)."""
        for version in await self.newest(name):
            record = await self.get(name, version)
            if record is not None and (accept is None or accept(record)):
                return record
        return None

    async def all(self, name: str | None = None) -> list[tuple[str, int, M]]:
        """Every record (of one name, if given), ordered by name then version."""
        keys = []
        for key in await self.table.keys():
            parsed = parse_version_key(key)
            if parsed and (name is None or parsed[0] == name):
                keys.append(parsed)
        out = []
        for record_name, version in sorted(keys):
            record = await self.get(record_name, version)
            if record is not None:
                out.append((record_name, version, record))
        return out

    async def delete(self, name: str, version: int) -> None:
        await self.table.delete(version_key(name, version))

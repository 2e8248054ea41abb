"""Aliases (``production``, ``staging``, …) over adapter versions, and rules that move them.

An alias is per tenant, because adapter names are shared by tenants (each version belongs to
one): key ``<name>.alias.<tenant>.<alias>`` holds a decimal version number, moved only by
compare-and-set, so two movers never lose an update and a reader never sees half a move.
A rule (``<name>.rule.<tenant>.<alias>``, a ``PromotionRule``) is checked whenever a version
registers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from swarm_contracts.names import METRIC_PATTERN
from swarm_contracts.registry import AdapterPromoted, AdapterVersion, AliasTarget, PromotionRule
from swarm_registry.errors import RegistryError
from swarm_registry.versions import CAS_RETRIES, Versions, check_name, read_int, scoped
from swarm_runtime.records import RecordTable

log = logging.getLogger(__name__)

Promoted = Callable[[AdapterPromoted], Awaitable[None]]


def alias_key(name: str, tenant: str, alias: str) -> str:
    return f"{name}.alias.{tenant}.{alias}"


def rule_key(name: str, tenant: str, alias: str) -> str:
    return f"{name}.rule.{tenant}.{alias}"


def better(value: float, than: float, mode: str) -> bool:
    return value < than if mode == "min" else value > than


class AliasBook:
    def __init__(
        self, kv: KeyValue, versions: Versions[AdapterVersion], promoted: Promoted
    ) -> None:
        self.kv = kv
        self.versions = versions
        self.rules: RecordTable[PromotionRule] = RecordTable(kv, PromotionRule)
        self.promoted = promoted

    async def read(self, name: str, tenant: str, alias: str) -> int | None:
        found = await read_int(self.kv, alias_key(name, tenant, alias))
        return found[0] if found else None

    async def holders(self, name: str) -> dict[tuple[str, str], int]:
        """(tenant, alias) -> version, for every alias of ``name``."""
        prefix = f"{name}.alias."
        out = {}
        for key in await self.rules.keys():
            if key.startswith(prefix):
                tenant, _, alias = key[len(prefix) :].partition(".")
                version = await self.read(name, tenant, alias)
                if version is not None:
                    out[(tenant, alias)] = version
        return out

    async def _move(
        self,
        record: AdapterVersion,
        alias: str,
        rule: PromotionRule | None,
        improves: Callable[[AdapterVersion | None], bool],
    ) -> AliasTarget | None:
        """Point ``alias`` at ``record`` by compare-and-set if ``improves(current holder)``.

        On a conflict the holder is re-read and the test re-run: of two versions racing for
        one rule, the second is compared against the first, never against a stale holder.
        """
        key = alias_key(record.name, record.tenant, alias)
        for _ in range(CAS_RETRIES):
            current = await read_int(self.kv, key)
            holder = (
                await self.versions.get(scoped(record.tenant, record.name), current[0])
                if current
                else None
            )
            if not improves(holder):
                return None
            try:
                if current is None:
                    await self.kv.create(key, str(record.version).encode())
                else:
                    await self.kv.update(key, str(record.version).encode(), last=current[1])
            except KeyWrongLastSequenceError:
                continue
            previous = current[0] if current else None
            await self.promoted(
                AdapterPromoted(
                    name=record.name,
                    tenant=record.tenant,
                    alias=alias,
                    version=record.version,
                    previous_version=previous,
                    rule=rule,
                    metrics=record.lineage.metrics,
                    previous_metrics=holder.lineage.metrics if holder else {},
                )
            )
            return AliasTarget(
                name=record.name,
                tenant=record.tenant,
                alias=alias,
                version=record.version,
                previous_version=previous,
            )
        raise RegistryError(
            f"alias {alias!r} of {record.name!r}: too many concurrent moves", "conflict"
        )

    async def set(self, record: AdapterVersion, alias: str) -> AliasTarget:
        check_name(alias, "alias")
        moved = await self._move(record, alias, None, lambda _: True)
        assert moved is not None  # an unconditional move always writes
        # A delete of this version may have checked the aliases just before this move: if
        # the record is gone now, put the alias back rather than leave it dangling.
        if await self.versions.get(scoped(record.tenant, record.name), record.version) is None:
            await self._restore(moved)
            raise RegistryError(
                f"unknown adapter {record.name!r} version {record.version}", "not_found"
            )
        return moved

    async def _restore(self, moved: AliasTarget) -> None:
        key = alias_key(moved.name, moved.tenant, moved.alias)
        if moved.previous_version is None:
            await self.kv.delete(key)
        else:
            await self.kv.put(key, str(moved.previous_version).encode())

    async def set_rule(self, rule: PromotionRule) -> PromotionRule:
        check_name(rule.name, "adapter name")
        check_name(rule.alias, "alias")
        if rule.tenant is None:
            raise RegistryError("a promotion rule needs a tenant")
        check_name(rule.tenant, "tenant")
        if not re.match(METRIC_PATTERN, rule.metric):
            raise RegistryError(f"invalid metric {rule.metric!r}: must match {METRIC_PATTERN}")
        await self.rules.put(rule_key(rule.name, rule.tenant, rule.alias), rule)
        return rule

    async def rules_for(self, name: str, tenant: str) -> list[PromotionRule]:
        prefix = f"{name}.rule.{tenant}."
        rules = []
        for key in await self.rules.keys():
            if key.startswith(prefix):
                found = await self.rules.get(key)
                if found is not None:
                    rules.append(found[0])
        return rules

    async def apply_rules(self, record: AdapterVersion) -> list[AliasTarget]:
        """Move every alias whose rule this new version satisfies."""
        moved: list[AliasTarget] = []
        if record.quarantine is not None:
            return moved  # never promoted while quarantined
        for rule in await self.rules_for(record.name, record.tenant):
            found = record.lineage.metrics.get(rule.metric)
            if found is None:
                log.info(
                    "%s v%d has no %s: rule for %r skipped",
                    record.name,
                    record.version,
                    rule.metric,
                    rule.alias,
                )
                continue
            value: float = found
            if not rule.reached(value):
                log.info(
                    "%s v%d: %s %s misses the threshold %s of the rule for %r",
                    record.name,
                    record.version,
                    rule.metric,
                    value,
                    rule.threshold,
                    rule.alias,
                )
                continue

            def improves(
                holder: AdapterVersion | None, rule: PromotionRule = rule, value: float = value
            ) -> bool:
                if holder is None:
                    return True
                if holder.version == record.version:
                    return False
                held = holder.lineage.metrics.get(rule.metric)
                return held is None or better(value, held, rule.mode)

            target = await self._move(record, rule.alias, rule, improves)
            if target is not None:
                moved.append(target)
        return moved

"""References to versioned artifacts: ``name``, ``name@3`` or ``name@alias``.

One parser for base models (``tiny-llama@2``), adapters (``support-bot@production``) and
lineage parents (``bot@1``), used by the gateway, scheduler, registry, trainer and CLI.
"""

from __future__ import annotations

from typing import NamedTuple


class Ref(NamedTuple):
    name: str
    version: int | None = None
    alias: str | None = None

    @classmethod
    def parse(cls, ref: str) -> Ref:
        """``name`` -> latest; ``name@3`` -> version 3; ``name@prod`` -> alias ``prod``.

        Raises ValueError for an empty name or an empty ``@`` tail."""
        name, sep, tail = ref.partition("@")
        if not name or (sep and not tail):
            raise ValueError(f"{ref!r} is not NAME, NAME@VERSION or NAME@ALIAS")
        if not sep:
            return cls(name)
        return cls(name, version=int(tail)) if tail.isdigit() else cls(name, alias=tail)

    @classmethod
    def parse_versioned(cls, ref: str) -> Ref:
        """``name`` or ``name@version``: where an alias is not allowed (base models)."""
        parsed = cls.parse(ref)
        if parsed.alias is not None:
            raise ValueError(f"{ref!r} is not NAME or NAME@VERSION")
        return parsed

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.alias is not None:
            return f"{self.name}@{self.alias}"
        return self.name

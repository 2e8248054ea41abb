"""The reply of every internal request/reply API (registry, telemetry, trainer export).

A reply is ``ok`` with a ``result``, or refused with an ``error`` a person can read and a
``code`` a program can act on. The codes are few on purpose: each is one way a caller reacts
(the gateway maps each to one HTTP status).
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

ErrorCode = Literal["not_found", "conflict", "invalid", "forbidden", "internal"]
"""``not_found``: no such thing (for this tenant); ``conflict``: the current state forbids it
(an alias holds the version, a concurrent change won), retrying later may work; ``invalid``:
the request itself is wrong; ``forbidden``: not this caller's to do; ``internal``: the
service failed."""

ERROR_CODES: tuple[ErrorCode, ...] = ("not_found", "conflict", "invalid", "forbidden", "internal")

T = TypeVar("T")


class Reply(BaseModel, Generic[T]):
    """``ok`` with a result, or an error a caller can show, with its code."""

    ok: bool
    error: str | None = None
    code: ErrorCode | None = Field(
        default=None,
        description="set when ok is false; a reply from a service older than the codes has "
        "none, which reads as invalid",
    )
    result: T | None = None

    @property
    def error_code(self) -> ErrorCode:
        """The refusal's code (``invalid`` for a coded-less refusal of an older service)."""
        return self.code or "invalid"

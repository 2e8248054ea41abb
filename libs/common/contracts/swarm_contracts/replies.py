"""The actions and replies of every internal request/reply API (registry, telemetry, trainer
export, a worker's questions to the scheduler).

An ``Action`` names one operation once, for the service that answers it and for every caller:
its subject's last part, its request model, and the type of its reply's result.

A reply is ``ok`` with a ``result``, or refused with an ``error`` a person can read and a
``code`` a program can act on. The codes are few on purpose: each is one way a caller reacts
(the gateway maps each to one HTTP status).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

ErrorCode = Literal["not_found", "conflict", "invalid", "forbidden", "internal"]
"""``not_found``: no such thing (for this tenant); ``conflict``: the current state forbids it
(an alias holds the version, a concurrent change won), retrying later may work; ``invalid``:
the request itself is wrong; ``forbidden``: not this caller's to do; ``internal``: the
service failed."""

ERROR_CODES: tuple[ErrorCode, ...] = ("not_found", "conflict", "invalid", "forbidden", "internal")

T = TypeVar("T")
Req = TypeVar("Req", bound=BaseModel)
# Covariant: an action whose result is a ModelVersion also gives a ModelVersion | None, which
# a caller assigning the result to an optional variable asks of it.
Res_co = TypeVar("Res_co", covariant=True)


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


@dataclass(frozen=True)
class Action(Generic[Req, Res_co]):
    """One operation of a service's request/reply API, e.g. ``Action("models.get", GetModel,
    ModelVersion)``: asked with a ``request`` on the service's subject for ``name``
    (``swarm.registry.models.get``), answered with a ``Reply[result]``."""

    name: str
    request: type[Req]
    result: type[Res_co]

    @property
    def reply(self) -> type[Reply[Res_co]]:
        """The model of this action's replies (``Reply[result]``)."""
        reply: type[Reply[Res_co]] = Reply[self.result]  # type: ignore[name-defined]
        return reply

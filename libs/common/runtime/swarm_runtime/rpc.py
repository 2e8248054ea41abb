"""Typed request/reply between services: one way to ask, one way to answer.

Every operation is an ``Action`` of the contracts (``swarm_contracts.registry_api`` lists the
registry's): it names the subject, the request model and the result type once, for the caller
and for the service. A caller sends an action's request and gets ``Reply[result]`` back
(``ServiceClient.ask``), or the result itself (``ServiceClient.call``, which raises
``Refused`` carrying the reply's code).
Nobody answering (no responders, a timeout, NATS itself down) is ``Unavailable``: a caller may
try again later, and it is never mistaken for a refusal. A handler wraps its work in
``answer()``: a ``Refused`` becomes an error reply with its code, any other exception an
``internal`` one, so that a requester is never left waiting for a timeout. A service lists its
handlers as ``route(action, handler)``, which type-checks each handler against its action.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, TypeVar

import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel, ValidationError

from swarm_contracts.replies import Action, ErrorCode, Reply
from swarm_runtime.tracing import trace_headers

log = logging.getLogger(__name__)

T = TypeVar("T")
Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res")


class Refused(Exception):
    """The service answered, and said no: ``code`` says how, the message says why."""

    def __init__(self, message: str, code: ErrorCode = "invalid") -> None:
        super().__init__(message)
        self.message = message
        self.code: ErrorCode = code


class Unavailable(ConnectionError):
    """Nobody answered: the service is not running, too slow, or NATS is down."""

    def __init__(self, service: str, reason: str) -> None:
        super().__init__(f"the {service} service is unavailable: {reason}")
        self.service = service
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its constructor's arguments: an error raised in a Ray worker (another
        # process) reaches the driver pickled, and must arrive as itself, not as a TypeError.
        return type(self), (self.service, self.reason), self.__dict__


class ServiceClient:
    """Requests to one service's API, e.g. ``ServiceClient(nc, "registry", subjects.registry)``.

    ``subject(name)`` is the subject of the action of that name (``"models.get"``). Every
    request carries the caller's trace context, so the service's spans join the caller's trace.
    """

    def __init__(
        self,
        nc: Client,
        service: str,
        subject: Callable[[str], str],
        timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.service = service
        self.subject = subject
        self.timeout = timeout

    async def ask(
        self, action: Action[Req, Res], request: Req, *, wait_s: float | None = None
    ) -> Reply[Res]:
        """The service's reply, refusals included; ``Unavailable`` when nobody answers, and
        ``Refused`` (internal) when the answer is not a ``Reply[result]``. ``wait_s`` overrides
        the client's timeout for a slow action."""
        subject = self.subject(action.name)
        timeout = wait_s or self.timeout
        try:
            msg = await self.nc.request(
                subject,
                request.model_dump_json().encode(),
                timeout=timeout,
                headers=trace_headers(),
            )
        except nats.errors.NoRespondersError as exc:
            raise Unavailable(self.service, f"not running (no responders on {subject})") from exc
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise Unavailable(self.service, f"no answer on {subject} within {timeout:g}s") from exc
        except nats.errors.Error as exc:
            raise Unavailable(self.service, f"NATS unavailable: {exc!r}") from exc
        try:
            return action.reply.model_validate_json(msg.data)
        except ValidationError as exc:
            raise Refused(
                f"the {self.service} service sent a malformed reply to {action.name}: {exc}",
                "internal",
            ) from exc

    async def call(
        self, action: Action[Req, Res], request: Req, *, wait_s: float | None = None
    ) -> Res:
        """The reply's result; ``Refused`` with the reply's code and message when refused."""
        reply = await self.ask(action, request, wait_s=wait_s)
        if not reply.ok:
            raise Refused(reply.error or f"{self.service} refused {action.name}", reply.error_code)
        if reply.result is None:
            raise Refused(
                f"the {self.service} service answered {action.name} without a result", "internal"
            )
        return reply.result


async def answer(reply_type: type[Reply[T]], work: Awaitable[T]) -> Reply[T]:
    """Run a handler's work into a reply: a refusal keeps its code, any other failure is
    ``internal`` (and logged with its traceback)."""
    try:
        return reply_type(ok=True, result=await work)
    except Refused as exc:
        return reply_type(ok=False, error=exc.message, code=exc.code)
    except Exception as exc:
        log.exception("request failed")
        return reply_type(
            ok=False, error=f"internal error: {type(exc).__name__}: {exc}", code="internal"
        )


@dataclass(frozen=True)
class Route:
    """One action a service answers: its handler, and how many requests it may work on at once
    (``max_workers`` of its subscriber)."""

    action: Action[Any, Any]
    handler: Callable[..., Awaitable[Reply[Any]]]
    workers: int = 1


def route(
    action: Action[Req, Res],
    handler: Callable[Concatenate[Req, ...], Awaitable[Reply[Res]]],
    workers: int = 1,
) -> Route:
    """A ``Route``, made here so that the type checker holds the handler to its action: it
    takes the action's request (then whatever else its framework passes it) and answers a
    ``Reply`` of the action's result."""
    return Route(action, handler, workers)

"""Request/reply calls to the registry and telemetry services."""

from __future__ import annotations

import json
from typing import TypeVar

import nats.errors
from fastapi import HTTPException, status
from pydantic import BaseModel, ValidationError

from swarm_common.registry import Reply
from swarm_gateway.errors import ServiceUnavailable
from swarm_gateway.state import Gateway

T = TypeVar("T")


async def call(
    gw: Gateway,
    service: str,
    subject: str,
    request: BaseModel | dict,
    result_type: type[T],
    timeout: float | None = None,
) -> T:
    """Send ``request`` and return the reply's result; map every failure to a clear HTTP error.

    No responders or a timeout means the service is down: 503 rather than a 500 with a trace.
    An ``ok: false`` reply is the service's answer to a bad request: 404 for unknown names,
    502 for the service's own internal errors, 422 otherwise; its message is the detail.
    """
    payload = (
        request.model_dump_json().encode()
        if isinstance(request, BaseModel)
        else json.dumps(request).encode()
    )
    timeout = timeout or gw.request_timeout_s
    try:
        msg = await gw.nc.request(subject, payload, timeout=timeout)
    except nats.errors.NoRespondersError as exc:
        raise ServiceUnavailable(
            f"the {service} service is not running (no responders on {subject})"
        ) from exc
    except (TimeoutError, nats.errors.TimeoutError) as exc:
        raise ServiceUnavailable(
            f"the {service} service did not answer within {timeout:g}s"
        ) from exc
    except nats.errors.Error as exc:
        raise ServiceUnavailable(f"NATS unavailable: {exc}") from exc
    try:
        reply = Reply[result_type].model_validate_json(msg.data)  # type: ignore[valid-type]
    except ValidationError as exc:
        raise ServiceUnavailable(f"the {service} service sent a malformed reply: {exc}") from exc
    if not reply.ok:
        error = reply.error or f"{service} refused the request"
        raise HTTPException(_status_for(error), detail=error)
    if reply.result is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"{service}: no result")
    return reply.result


def _status_for(error: str) -> int:
    # Services report errors as text (Reply.error); their wording is the only signal.
    lowered = error.lower()
    if lowered.startswith("unknown ") or "not found" in lowered:
        return status.HTTP_404_NOT_FOUND
    if lowered.startswith("internal error"):
        return status.HTTP_502_BAD_GATEWAY
    return status.HTTP_422_UNPROCESSABLE_CONTENT

"""HTTP errors: FastAPI's own validation shape for 4xx, and the one mapping of the services'
refusal codes (``Reply.code``) to HTTP statuses."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, status

from swarm_contracts.replies import ErrorCode

# The registry's (or telemetry's, or a trainer's) refusal, as the gateway's status. Their own
# failures are the gateway's upstream failing: 502. Nobody answering is a 503 (``Unavailable``).
STATUS_OF_CODE: dict[ErrorCode, int] = {
    "not_found": status.HTTP_404_NOT_FOUND,
    "conflict": status.HTTP_409_CONFLICT,
    "invalid": status.HTTP_422_UNPROCESSABLE_CONTENT,
    "forbidden": status.HTTP_403_FORBIDDEN,
    "internal": status.HTTP_502_BAD_GATEWAY,
}


def field_error(
    status_code: int, loc: list[str | int], msg: str, type_: str = "value_error"
) -> HTTPException:
    detail: list[dict[str, Any]] = [{"loc": loc, "msg": msg, "type": type_}]
    return HTTPException(status_code, detail=detail)


def upstream_status(status_code: int) -> int:
    """A status a service behind the gateway chose (an inference worker's error), as the
    gateway's: its client errors and 503 pass through; its own failures are the gateway's
    upstream failing, 502, never a 500 of the gateway's."""
    if 400 <= status_code < 500 or status_code == 503:
        return status_code
    return status.HTTP_502_BAD_GATEWAY

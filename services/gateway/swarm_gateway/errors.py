"""Errors in FastAPI's own validation shape, so that clients parse one format for every 4xx."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException


def field_error(
    status_code: int, loc: list[str | int], msg: str, type_: str = "value_error"
) -> HTTPException:
    detail: list[dict[str, Any]] = [{"loc": loc, "msg": msg, "type": type_}]
    return HTTPException(status_code, detail=detail)


class ServiceUnavailable(Exception):
    """A backing service (registry, telemetry, NATS) did not answer; the gateway says 503."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

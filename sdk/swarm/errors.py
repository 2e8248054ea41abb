"""Errors the SDK raises, and the mapping from a gateway answer to one of them."""

from __future__ import annotations

import json
from typing import Any

import httpx


class SwarmError(Exception):
    """An error answer from the gateway (or no answer at all), with the gateway's detail."""

    def __init__(self, message: str, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class AuthError(SwarmError):
    pass


class NotFoundError(SwarmError):
    pass


class ValidationError(SwarmError):
    pass


class ServiceUnavailableError(SwarmError):
    pass


def describe_detail(detail: Any) -> str:
    """FastAPI details are a string or a list of {loc, msg}: make either one readable."""
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc}: {item.get('msg')}" if loc else str(item.get("msg")))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def raise_for(resp: httpx.Response) -> None:
    """Raise the SwarmError subclass for a non-2xx answer (its body must have been read)."""
    if resp.is_success:
        return
    try:
        body = resp.json()
        # FastAPI's {"detail": ...}, or OpenAI's {"error": {"message": ...}} (inference routes).
        if isinstance(body.get("error"), dict) and "detail" not in body:
            detail = body["error"].get("message", resp.text)
        else:
            detail = body.get("detail", resp.text)
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        detail = resp.text
    message = f"HTTP {resp.status_code}: {describe_detail(detail)}"
    cls: type[SwarmError] = SwarmError
    if resp.status_code in (401, 403):
        cls = AuthError
    elif resp.status_code == 404:
        cls = NotFoundError
    elif resp.status_code in (400, 409, 413, 422):
        cls = ValidationError
    elif resp.status_code == 503:
        cls = ServiceUnavailableError
    raise cls(message, resp.status_code, detail)


def unreachable(base_url: str, exc: Exception) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"cannot reach the Swarm gateway at {base_url}: {exc}"
        " (is it running? try `swarm up`, or set SWARM_GATEWAY_URL)"
    )

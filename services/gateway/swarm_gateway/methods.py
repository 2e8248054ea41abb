"""``OPTIONS`` and ``405`` that tell the truth: the ``Allow`` header lists every method of the
path (RFC 9110), not those of the first route the router happened to try (``/v1/jobs`` has a
GET and a POST route: the router's own 405 said ``Allow: POST``).

A concrete path is served by its own operations only, as OpenAPI matches it before a templated
one: ``/v1/jobs/estimate`` is a POST, not also the GET of ``/v1/jobs/{job_id}``.

The table comes from the OpenAPI document, the public list of operations; paths outside it
(the dashboard page, ``/metrics``) keep the router's own answers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from swarm_gateway.openai_errors import OpenAIError, is_openai_route

# (path pattern, methods, whether the path is concrete: no {parameter} in it)
MethodTable = list[tuple[re.Pattern[str], frozenset[str], bool]]
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def method_table(document: dict[str, Any]) -> MethodTable:
    """(path pattern, methods) for every path of an OpenAPI document."""
    table = []
    for path, item in document.get("paths", {}).items():
        methods = {m.upper() for m in item if m in _METHODS}
        if "GET" in methods:
            methods.add("HEAD")
        pattern = re.escape(path)
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", pattern)
        table.append((re.compile(f"^{pattern}$"), frozenset(methods), "{" not in path))
    return table


def allowed_methods(table: MethodTable, path: str) -> set[str]:
    """Every method some operation serves at ``path`` (empty: not a documented path)."""
    found: set[str] = set()
    for pattern, methods, concrete in table:
        if pattern.match(path):
            if concrete:
                return set(methods)
            found |= methods
    return found


class MethodsMiddleware:
    """Answers ``OPTIONS`` (204) and a method the path does not serve (405), both with the
    path's ``Allow`` header; everything else goes on to the app."""

    def __init__(self, app: ASGIApp, document: Callable[[], dict[str, Any]]) -> None:
        self.app = app
        self.document = document
        self.table: MethodTable | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.table is None:
                self.table = method_table(self.document())
            methods = allowed_methods(self.table, scope["path"])
            if methods and scope["method"] not in methods:
                allow = ", ".join(sorted(methods | {"OPTIONS"}))
                response: Response
                if scope["method"] == "OPTIONS":
                    response = Response(status_code=204, headers={"Allow": allow})
                elif is_openai_route("GET", scope["path"]):
                    error = OpenAIError(405, f"{scope['method']} is not allowed here ({allow} are)")
                    response = error.response()
                    response.headers["Allow"] = allow
                else:
                    response = JSONResponse(
                        {"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": allow}
                    )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

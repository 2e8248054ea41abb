"""``OPTIONS`` and ``405`` that tell the truth: the ``Allow`` header lists every method of the
path (RFC 9110), not those of the first route the router happened to try (``/v1/jobs`` has a
GET and a POST route: the router's own 405 said ``Allow: POST``).

A concrete path is served by its own operations only, as OpenAPI matches it before a templated
one: ``/v1/jobs/estimate`` is a POST, not also the GET of ``/v1/jobs/{job_id}``.

The table holds the operations the OpenAPI document lists (the public list of operations),
read from the routes the document is made of: making the document itself takes a tenth of a
second or more, on the first request of every app. Paths outside it (the dashboard page,
``/metrics``) keep the router's own answers."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.routing import APIRoute, iter_route_contexts
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from swarm_gateway.openai_errors import OpenAIError, is_openai_route

# (path pattern, methods, whether the path is concrete: no {parameter} in it)
MethodTable = list[tuple[re.Pattern[str], frozenset[str], bool]]
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


# (path as the OpenAPI document writes it, its methods)
Operations = list[tuple[str, set[str]]]


def route_operations(routes: Sequence[Any]) -> Operations:
    """The operations FastAPI's OpenAPI document of ``routes`` lists: every ``APIRoute`` not
    left out of the schema (included routers' too), under its full path format.
    ``tests/gateway/test_methods.py`` checks the two agree."""
    return [
        (str(context.path_format), set(context.methods or ()))
        for context in iter_route_contexts(routes)
        if isinstance(context.original_route, APIRoute) and context.include_in_schema
    ]


def method_table(operations: Operations) -> MethodTable:
    """(path pattern, methods) for every path of ``operations``."""
    by_path: dict[str, set[str]] = {}
    for path, methods in operations:
        by_path.setdefault(path, set()).update(m.upper() for m in methods)
    table = []
    for path, methods in by_path.items():
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

    def __init__(self, app: ASGIApp, operations: Callable[[], Operations]) -> None:
        self.app = app
        self.operations = operations
        self.table: MethodTable | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.table is None:
                self.table = method_table(self.operations())
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

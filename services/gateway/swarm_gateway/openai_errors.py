"""OpenAI's error shape for the OpenAI-compatible routes.

``{"error": {"message", "type", "param", "code"}}``, with OpenAI's status codes (400 for a
bad request, 404 for an unknown model, ...), so that the stock ``openai`` client raises its
own ``BadRequestError``/``NotFoundError``/... with the message. Every answer but a success
on those routes has it, 401 and 405 included. The other routes keep FastAPI's
``{"detail": ...}``.

The OpenAI routes: chat and text completions, files, fine-tuning jobs, and the reads of
``/v1/models`` (OpenAI's ``models.list`` and ``models.retrieve``; uploading a base model is
Swarm's own).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm_gateway.responses import FiniteJSONResponse, finite

OPENAI_PATHS = re.compile(r"^/v1/(chat/completions|completions|files(/.*)?|fine_tuning(/.*)?)$")
OPENAI_READS = re.compile(r"^/v1/models(/[^/]+)?$")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "api_error")

    def __reduce__(self) -> tuple[Any, ...]:
        # Like every exception here, it must pickle (it may cross a process boundary).
        return type(self), (self.status, self.message), self.__dict__

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> FiniteJSONResponse:
        return FiniteJSONResponse(self.body(), status_code=self.status)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def is_openai_route(method: str, path: str) -> bool:
    if OPENAI_PATHS.match(path):
        return True
    return method in ("GET", "HEAD") and bool(OPENAI_READS.match(path))


def is_openai(request: Request) -> bool:
    return is_openai_route(request.method, request.url.path)


async def on_server_error(request: Request, exc: Exception) -> Response:
    """A bug's 500: OpenAI's shape on its routes (the stock client reads the message), the
    plain text of Starlette's own answer elsewhere. The exception is still logged."""
    if is_openai(request):
        return OpenAIError(500, "internal error in the Swarm gateway").response()
    return PlainTextResponse("Internal Server Error", status_code=500)


async def on_openai_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    if not is_openai(request):
        # FastAPI's own shape, rendered even when an ``input`` is NaN (``"lr": NaN``).
        errors = finite(jsonable_encoder(exc.errors()), str)
        return FiniteJSONResponse({"detail": errors}, status_code=422)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    return OpenAIError(
        400, f"{param}: {message}" if param else message, param=param, code="invalid_value"
    ).response()


# FastAPI's answer to a body it cannot even decode (bytes that are not UTF-8, say).
_UNPARSABLE = "There was an error parsing the body"


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if not is_openai(request):
        multipart = request.headers.get("content-type", "").startswith("multipart/")
        if exc.status_code == 400 and (exc.detail == _UNPARSABLE or multipart):
            # Bad input is a 422 naming the field, like every other: here the whole body (not
            # JSON, or a multipart form Starlette cannot parse: "Invalid multipart data.", ...).
            msg = (
                f"the multipart form is broken: {exc.detail}"
                if multipart
                else "the body is not valid JSON"
            )
            kind = "multipart_invalid" if multipart else "json_invalid"
            errors = [{"loc": ["body"], "msg": msg, "type": kind}]
            return FiniteJSONResponse({"detail": errors}, status_code=422)
        return await http_exception_handler(request, exc)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    response = OpenAIError(exc.status_code, detail).response()
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response

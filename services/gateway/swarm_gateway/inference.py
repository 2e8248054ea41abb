"""Routing a generation to an inference worker and reading its answer back.

``resolve`` turns the caller's ``model`` into a base model version and, for an adapter, the
pinned ``name@version`` (as the caller's tenant sees it: another tenant's adapter is unknown,
404). ``generate`` sends the request to ``swarm.inference.<base>.<version>.generate`` (the
queue group of the workers holding that version) with a fresh inbox as the reply subject and
yields the worker's ``text`` and ``done`` chunks.

A worker that dies mid-request goes silent: keepalives stop, so after
``SWARM_INFERENCE_IDLE_TIMEOUT_S`` without a chunk the request is taken for lost. If no text
was streamed yet it is sent again (a new attempt, new inbox: any other worker of the group
may take it), else it fails with a clean error. The same happens for a worker that answers
"overloaded" or "stopping". A request whose caller goes away is cancelled on the worker.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from pydantic import ValidationError

from swarm_contracts.inference import CancelGeneration, GenerateChunk, GenerateRequest
from swarm_contracts.jobs import NAME_PATTERN
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetAdapter, GetModel
from swarm_contracts.registry_api import GET_ADAPTER, GET_MODEL
from swarm_gateway.errors import STATUS_OF_CODE, upstream_status
from swarm_gateway.openai_errors import OpenAIError, model_not_found
from swarm_gateway.state import Gateway
from swarm_runtime.rpc import Refused, Unavailable

log = logging.getLogger(__name__)
# Worker errors worth another worker's try (when nothing was streamed yet).
RETRYABLE = {"overloaded", "worker_stopping"}


@dataclass(frozen=True)
class Target:
    base_model: str
    base_model_version: int
    adapter: str | None  # pinned name@version

    @property
    def label(self) -> str:
        """What answers: ``support-bot@3``, or the base model ``tiny-llama@1``."""
        return self.adapter or f"{self.base_model}@{self.base_model_version}"


async def resolve(gw: Gateway, model: str, tenant: str) -> Target:
    """A base model (``tiny-llama``, ``tiny-llama@1``) or one of ``tenant``'s adapters
    (``bot``, ``bot@3``, ``bot@production``); base model names are looked up first."""
    try:
        ref = Ref.parse(model)
    except ValueError:
        raise model_not_found(model) from None
    if not re.match(NAME_PATTERN, ref.name):
        raise model_not_found(model)
    try:
        if ref.alias is None:
            try:
                get = GetModel(name=ref.name, version=ref.version)
                base = await gw.registry.call(GET_MODEL, get)
                return Target(base.name, base.version, None)
            except Refused as exc:
                if exc.code != "not_found":
                    raise
        request = GetAdapter(name=model, tenant=tenant)
        adapter = await gw.registry.call(GET_ADAPTER, request)
    except Refused as exc:
        if exc.code == "not_found":
            raise model_not_found(model) from exc
        raise OpenAIError(STATUS_OF_CODE[exc.code], exc.message) from exc
    except Unavailable as exc:
        raise OpenAIError(503, str(exc), code="service_unavailable") from exc
    lineage = adapter.lineage
    return Target(
        lineage.base_model, lineage.base_model_version, f"{adapter.name}@{adapter.version}"
    )


def _read(msg: Msg, base: str) -> GenerateChunk:
    """The worker's chunk; a no-responders status or a malformed reply is an ``OpenAIError``."""
    if msg.headers and msg.headers.get("Status") == "503":
        raise OpenAIError(
            503, f"no inference worker serves {base} right now", code="model_not_served"
        )
    try:
        return GenerateChunk.model_validate_json(msg.data)
    except ValidationError as exc:
        raise OpenAIError(502, f"the inference worker sent a malformed reply: {exc}") from exc


def _worker_error(chunk: GenerateChunk) -> OpenAIError:
    assert chunk.error is not None
    status = upstream_status(chunk.error.status)
    error = OpenAIError(status, chunk.error.message, code=chunk.error.code)
    if chunk.error.code == "model_not_found":
        error.param = "model"
    return error


async def generate(gw: Gateway, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
    """Yield the worker's ``text`` chunks, then its ``done`` chunk; raise ``OpenAIError``."""
    settings = gw.settings
    subject = gw.subjects.inference_generate(request.base_model, request.base_model_version)
    base = f"{request.base_model}@{request.base_model_version}"
    streamed = False
    failure: OpenAIError | None = None
    for attempt in range(1, settings.inference_attempts + 1):
        this = request.model_copy(
            update={"attempt": attempt, "request_id": f"{request.request_id}-{attempt}"}
        )
        inbox = gw.nc.new_inbox()
        sub = await gw.nc.subscribe(inbox)
        finished = False
        try:
            await gw.nc.publish(subject, this.model_dump_json().encode(), reply=inbox)
            while True:
                try:
                    msg = await sub.next_msg(timeout=settings.inference_idle_timeout_s)
                except (nats.errors.TimeoutError, TimeoutError):
                    failure = OpenAIError(
                        502,
                        f"the inference worker serving {base} went silent for "
                        f"{settings.inference_idle_timeout_s:g}s",
                        code="worker_lost",
                    )
                    log.warning("request %s: %s", this.request_id, failure.message)
                    break
                chunk = _read(msg, base)
                if chunk.kind in ("accepted", "keepalive"):
                    continue
                if chunk.kind == "text":
                    streamed = True
                    yield chunk
                    continue
                finished = True  # done or error: the worker has stopped
                if chunk.kind == "error":
                    error = _worker_error(chunk)
                    if error.code in RETRYABLE and not streamed:
                        failure = error
                        break
                    raise error
                yield chunk
                return
        except OpenAIError:
            finished = True  # the worker is gone or answered nonsense: nothing to cancel
            raise
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if not finished:
                # Lost, retried, or our caller went away: the worker must not go on.
                with contextlib.suppress(Exception):
                    cancel = CancelGeneration(request_id=this.request_id, reason="caller gone")
                    await gw.nc.publish(
                        gw.subjects.inference_cancel(this.request_id),
                        cancel.model_dump_json().encode(),
                    )
        if streamed:
            break
    assert failure is not None
    if streamed:
        failure.message = f"{failure.message}; the answer was cut short"
    raise failure

"""The inference worker: holds base models, serves their generate subjects, heartbeats.

Each held base model version has its own ``Engine`` and its own subscription to
``swarm.inference.<name>.<version>.generate`` in the queue group ``inference-<name>-<version>``,
so that NATS spreads a base model's requests over the workers holding it. A request names
the tenant and, optionally, an adapter ref; the worker resolves the ref with the registry (as
that tenant: another tenant's adapter is unknown), fetches its files once (sha256-checked)
and hands it to the engine, which loads it into an LRU slot.

Long because: the held models, their subscriptions, adapter fetches and heartbeats share the
worker's engines and their state; the engine, sampling, adapter files and replies are their
own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from faststream.nats import NatsBroker, NatsMessage
from transformers import AutoTokenizer

from swarm_contracts.envelope import CloudEvent, envelope
from swarm_contracts.inference import (
    CancelGeneration,
    GenerateRequest,
    HeldModel,
    InferenceError,
    InferenceHeartbeat,
    Usage,
)
from swarm_contracts.refs import Ref
from swarm_contracts.registry import GetAdapter, GetModel, ListModels, ModelVersion
from swarm_contracts.registry_api import GET_ADAPTER, GET_MODEL, LIST_MODELS
from swarm_contracts.subjects import Subjects
from swarm_generation.sampling import SamplingParams
from swarm_generation.text_stream import token_texts
from swarm_inference.adapter_files import CONFIG_FILE, WEIGHTS_FILE, AdapterSource
from swarm_inference.base_model import load_base_model, pick_device, pick_dtype, render_chat
from swarm_inference.downloads import fetch_verified
from swarm_inference.engine import (
    AdapterUnavailable,
    Engine,
    EngineError,
    EngineStats,
    InvalidRequest,
    Piece,
    Step,
)
from swarm_inference.json_format import ANY_OBJECT
from swarm_inference.metrics import InferenceMetrics
from swarm_inference.replies import Replier
from swarm_inference.settings import InferenceSettings
from swarm_inference.vllm_backend import VllmEngine
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable
from swarm_runtime.store import NotFound, open_store
from swarm_runtime.tasks import cancel_and_wait

log = logging.getLogger("swarm.inference")
SERVICE = "inference"
HEARTBEAT_TYPE = "swarm.inference.heartbeat"
# A base model that failed to load is tried again after this long, not at every refresh.
RETRY_FAILED_S = 60.0


def default_worker_id() -> str:
    # A subject token: no dots, wildcards or spaces.
    host = re.sub(r"[^a-z0-9_-]", "-", socket.gethostname().lower())[:40] or "worker"
    return f"inference-{host}-{uuid.uuid4().hex[:6]}"


class RequestFailed(Exception):
    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.error = InferenceError(code=code, message=message, status=status)

    def __reduce__(self) -> tuple[Any, ...]:
        # Like every exception here, it must pickle (it may cross a process boundary).
        e = self.error
        return type(self), (e.code, e.message, e.status), self.__dict__


@dataclass
class HeldBase:
    name: str
    version: int
    engine: Engine | VllmEngine
    subscriber: Any = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass
class OpenRequest:
    task: asyncio.Task[None]
    replier: Replier
    started: float = field(default_factory=time.monotonic)


class InferenceWorker:
    def __init__(self, settings: InferenceSettings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self.subjects = Subjects(settings.namespace)
        self.worker_id = settings.inference_worker_id or default_worker_id()
        self.store = open_store(settings)
        self.device = pick_device(settings.inference_device)
        if settings.inference_cpu_threads is not None:
            torch.set_num_threads(settings.inference_cpu_threads)
        self.dtype = pick_dtype(self.device, settings.inference_dtype)
        self.root = Path(settings.work_dir) / "inference"
        self.held: dict[tuple[str, int], HeldBase] = {}
        self.open: dict[str, OpenRequest] = {}
        self.metrics = InferenceMetrics(self._engine_stats)
        self._fetched: set[str] = set()
        self._fetch_locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[tuple[str, int], float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._registry: ServiceClient | None = None
        self._cancel_sub: Any = None

    @property
    def registry(self) -> ServiceClient:
        if self._registry is None:  # the connection exists once the broker has started
            self._registry = ServiceClient(
                self.broker.connection, "registry", self.subjects.registry, timeout=10.0
            )
        return self._registry

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        sub = self.broker.subscriber(
            self.subjects.inference_cancel(), persistent=False, no_reply=True
        )

        async def on_cancel(request: CancelGeneration) -> None:
            self.cancel(request.request_id, request.reason)

        sub(on_cancel)
        await sub.start()
        self._cancel_sub = sub
        self._tasks = [
            asyncio.create_task(self._refresh_loop()),
            asyncio.create_task(self._heartbeat_loop()),
        ]
        log.info(
            "inference worker %s on %s (%s), models %r",
            self.worker_id,
            self.device,
            self.dtype,
            self.settings.inference_models,
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for held in self.held.values():
            if held.subscriber is not None:
                with contextlib.suppress(Exception):
                    await held.subscriber.stop()
        # Requests in flight get a clean, retryable error rather than silence.
        stopping = InferenceError(
            code="worker_stopping", message=f"worker {self.worker_id} is stopping", status=503
        )
        for request in list(self.open.values()):
            with contextlib.suppress(Exception):
                await request.replier.error(stopping)
            request.task.cancel()
        await cancel_and_wait([*self._tasks, *(r.task for r in self.open.values())])
        for held in self.held.values():
            await asyncio.to_thread(held.engine.stop)
        if self._cancel_sub is not None:
            with contextlib.suppress(Exception):
                await self._cancel_sub.stop()

    def cancel(self, request_id: str, reason: str = "") -> bool:
        request = self.open.get(request_id)
        if request is None:
            return False
        log.info("request %s cancelled by its caller %s", request_id, reason)
        request.replier.finished = True  # the caller is gone: answer nothing more
        request.task.cancel()
        return True

    # --- base models -----------------------------------------------------------------------
    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Unavailable as exc:  # e.g. the registry is not up yet: try again later
                log.warning("could not refresh the held base models: %s", exc)
            except Exception:
                log.exception("could not refresh the held base models")
            await asyncio.sleep(self.settings.inference_refresh_s)

    async def _wanted(self) -> list[ModelVersion]:
        spec = self.settings.inference_models.strip()
        if spec in ("", "*"):
            latest: dict[str, ModelVersion] = {}
            for model in await self.registry.call(LIST_MODELS, ListModels()):
                if model.name not in latest or model.version > latest[model.name].version:
                    latest[model.name] = model
            return list(latest.values())
        wanted = []
        for item in (i.strip() for i in spec.split(",")):
            if not item:
                continue
            ref = Ref.parse_versioned(item)
            try:
                get = GetModel(name=ref.name, version=ref.version)
                wanted.append(await self.registry.call(GET_MODEL, get))
            except Refused as exc:
                if exc.code != "not_found":
                    raise
                log.debug("%s is not registered (yet)", item)
        return wanted

    async def refresh(self) -> None:
        """Hold every wanted base model version not held yet (already held ones stay)."""
        for model in await self._wanted():
            key = (model.name, model.version)
            failed_at = self._failed.get(key)
            if key in self.held or (failed_at and time.monotonic() - failed_at < RETRY_FAILED_S):
                continue
            try:
                await self.hold(model)
            except Exception:
                log.exception("could not load base model %s@%d", model.name, model.version)
                self._failed[key] = time.monotonic()

    async def hold(self, model: ModelVersion) -> HeldBase:
        directory = self.root / "models" / model.name / str(model.version)
        await asyncio.to_thread(fetch_verified, self.store, model.store_key, model.files, directory)
        engine = await asyncio.to_thread(self._engine, directory)
        held = HeldBase(model.name, model.version, engine)
        subscriber = self.broker.subscriber(
            self.subjects.inference_generate(model.name, model.version),
            queue=f"inference-{model.name}-{model.version}",
            persistent=False,
            no_reply=True,
        )

        async def on_generate(request: GenerateRequest, message: NatsMessage) -> None:
            # Returns at once: the request is served by its own task, so that one
            # subscription serves any number of requests at a time.
            self.accept(request, message.reply_to)

        subscriber(on_generate)
        await subscriber.start()
        held.subscriber = subscriber
        self.held[(model.name, model.version)] = held
        log.info("holding %s on %s", held.ref, self.device)
        return held

    def _engine(self, directory: Path) -> Engine | VllmEngine:
        settings = self.settings
        if settings.inference_backend == "vllm":
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            return VllmEngine(
                directory,
                tokenizer,
                max_batch_size=settings.inference_max_batch_size,
                adapter_slots=settings.inference_adapter_slots,
                dtype=settings.inference_dtype,
            )
        network, tokenizer = load_base_model(directory, self.device, self.dtype)
        return Engine(
            network,
            tokenizer,
            max_batch_size=settings.inference_max_batch_size,
            max_wait_s=settings.inference_max_wait_ms / 1000.0,
            adapter_slots=settings.inference_adapter_slots,
        ).start()

    # --- requests --------------------------------------------------------------------------
    def accept(self, request: GenerateRequest, reply: str | None) -> None:
        if not reply:
            log.warning("request %s has no reply subject; nobody would hear the answer", request)
            return
        replier = Replier(
            self.broker.connection,
            reply,
            request.request_id,
            self.worker_id,
            stream=request.stream,
        )
        task = asyncio.create_task(self._serve(request, replier))
        self.open[request.request_id] = OpenRequest(task, replier)
        task.add_done_callback(lambda _: self.open.pop(request.request_id, None))

    async def _serve(self, request: GenerateRequest, replier: Replier) -> None:
        keepalive: asyncio.Task[None] | None = None
        outcome = "error"
        try:
            held = self._admit(request)
            await replier.accepted()
            keepalive = asyncio.create_task(self._keepalive(replier))
            adapter = await self._adapter_for(request, held)
            replier.model = adapter.key if adapter is not None else held.ref
            prompt_ids, params = self._sampling(request, held)
            await self._stream(
                held,
                prompt_ids,
                params,
                adapter,
                _json_schema(request),
                replier,
                token_level=request.prompt_tokens is not None,
                texts=request.token_texts,
            )
            outcome = "ok"
        except RequestFailed as exc:
            if exc.error.code == "overloaded":
                outcome = "overloaded"
            await replier.error(exc.error)
        except InvalidRequest as exc:
            await replier.error(InferenceError(code=exc.code, message=str(exc), status=400))
        except AdapterUnavailable as exc:
            log.error("request %s: %s", request.request_id, exc)
            await replier.error(InferenceError(code=exc.code, message=str(exc), status=500))
        except EngineError as exc:
            await replier.error(InferenceError(code=exc.code, message=str(exc), status=503))
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:
            log.exception("request %s failed", request.request_id)
            error = InferenceError(code="internal_error", message=f"internal error: {exc!r}")
            await replier.error(error)
        finally:
            if keepalive is not None:
                keepalive.cancel()
            self.metrics.requests.labels(outcome=outcome).inc()

    def _admit(self, request: GenerateRequest) -> HeldBase:
        """The base model the request runs on, or why this worker turns it away."""
        held = self.held.get((request.base_model, request.base_model_version))
        if held is None:
            raise RequestFailed(
                "model_not_found",
                f"worker {self.worker_id} does not hold "
                f"{request.base_model}@{request.base_model_version}",
                404,
            )
        limit = self.settings.inference_max_tokens
        if request.max_tokens is not None and request.max_tokens > limit:
            raise RequestFailed(
                "invalid_request_error",
                f"max_tokens {request.max_tokens} is over this service's limit of {limit}",
                400,
            )
        if held.engine.stats().queued >= self.settings.inference_max_queue:
            raise RequestFailed(
                "overloaded", f"worker {self.worker_id} has a full queue; try again", 503
            )
        return held

    def _sampling(
        self, request: GenerateRequest, held: HeldBase
    ) -> tuple[list[int], SamplingParams]:
        if request.prompt_tokens is not None:
            prompt_ids = _checked_tokens(request.prompt_tokens, len(held.engine.tokenizer))
        elif request.messages is not None:
            prompt = render_chat(held.engine.tokenizer, [m.model_dump() for m in request.messages])
            prompt_ids = held.engine.encode(prompt)
        else:
            assert request.prompt is not None
            prompt_ids = held.engine.encode(request.prompt)
        limit = self.settings.inference_max_tokens
        max_tokens = request.max_tokens
        if max_tokens is None:  # as many as the context leaves, up to the limit
            room = (held.engine.max_context or limit + len(prompt_ids)) - len(prompt_ids)
            max_tokens = max(1, min(limit, room))
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=tuple(request.stop),
            top_k=request.top_k,
            stop_tokens=None if request.stop_tokens is None else tuple(request.stop_tokens),
            logprobs=request.logprobs,
            prompt_logprobs=request.prompt_logprobs,
            top_logprobs=request.top_logprobs,
            prompt_top_logprobs=request.prompt_top_logprobs,
            prompt_targets=_checked_targets(request.prompt_target_ids, len(held.engine.tokenizer)),
            prompt_alt_tokens=request.prompt_alt_tokens,
        )
        return prompt_ids, params

    async def _stream(
        self,
        held: HeldBase,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: AdapterSource | None,
        json_schema: dict[str, Any] | None,
        replier: Replier,
        *,
        token_level: bool = False,
        texts: bool = False,
    ) -> None:
        """Generate into ``replier``; ``token_level``: the result carries the token ids;
        ``texts``: those and the text of every token id it names (OpenAI's logprobs)."""
        started = time.monotonic()
        first = True
        last = None
        async for piece in held.engine.generate(prompt_ids, params, adapter, json_schema):
            if first and piece.completion_tokens:
                self.metrics.first_token.observe(time.monotonic() - started)
                first = False
            if texts and piece.step is not None:  # each token's log-probabilities with its text
                await replier.text(
                    piece.text,
                    tokens=list(piece.step.tokens),
                    logprobs=list(piece.step.logprobs),
                    top_logprobs=piece.step.top_logprobs,
                    token_texts=_texts_of(held.engine.tokenizer, prompt_ids, piece.step),
                )
            else:
                await replier.text(piece.text)
            last = piece
        assert last is not None
        assert last.finish_reason is not None
        usage = Usage(
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            total_tokens=last.prompt_tokens + last.completion_tokens,
        )
        await replier.done(
            last.finish_reason,  # type: ignore[arg-type]
            usage,
            tokens=list(last.tokens) if token_level or texts else None,
            logprobs=None if last.logprobs is None else list(last.logprobs),
            prompt_logprobs=_json_floats(last.prompt_logprobs),
            top_logprobs=last.top_logprobs,
            prompt_top_logprobs=last.prompt_top_logprobs,
            prompt_target_logprobs=last.prompt_target_logprobs,
            prompt_alt_tokens=last.prompt_alt_tokens,
            token_texts=_texts_of(held.engine.tokenizer, prompt_ids, last) if texts else None,
        )
        self.metrics.tokens.inc(last.completion_tokens)

    async def _keepalive(self, replier: Replier) -> None:
        interval = self.settings.inference_keepalive_s
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - replier.last_sent >= interval * 0.9:
                await replier.keepalive()

    async def _adapter_for(self, request: GenerateRequest, held: HeldBase) -> AdapterSource | None:
        if request.adapter is None:
            return None
        # As the request's tenant: another tenant's adapter is unknown.
        get = GetAdapter(name=request.adapter, tenant=request.tenant)
        try:
            version = await self.registry.call(GET_ADAPTER, get)
        except Refused as exc:
            if exc.code == "not_found":
                raise RequestFailed("model_not_found", exc.message, 404) from exc
            raise RequestFailed("invalid_request_error", exc.message, 400) from exc
        except Unavailable as exc:
            raise RequestFailed("registry_unavailable", str(exc), 503) from exc
        lineage = version.lineage
        if (lineage.base_model, lineage.base_model_version) != (held.name, held.version):
            raise RequestFailed(
                "model_mismatch",
                f"{version.name}@{version.version} was trained on {lineage.base_model}@"
                f"{lineage.base_model_version}, not {held.ref}",
                400,
            )
        key = f"{version.name}@{version.version}"
        directory = self.root / "adapters" / version.tenant / version.name / str(version.version)
        if key not in self._fetched:
            lock = self._fetch_locks.setdefault(key, asyncio.Lock())
            async with lock:
                if key not in self._fetched:
                    try:
                        await asyncio.to_thread(
                            fetch_verified,
                            self.store,
                            version.store_key,
                            version.files,
                            directory,
                            (CONFIG_FILE, WEIGHTS_FILE),
                        )
                    except (NotFound, OSError, RuntimeError) as exc:
                        raise RequestFailed(
                            "adapter_unavailable", f"{key}: cannot fetch its files: {exc}", 500
                        ) from exc
                    self._fetched.add(key)
        return AdapterSource(key, directory, version.files)

    def document(self, broker: NatsBroker) -> None:
        """Declare, for the AsyncAPI document only (never started), what this worker
        subscribes to at run time: one generate subject per held base model version."""

        async def generate(request: GenerateRequest) -> None:
            """A generation request; the answer streams to its reply subject as
            ``GenerateChunk`` messages (``GenerateResult`` once, when ``stream`` is false)."""

        async def cancel(request: CancelGeneration) -> None:
            """Stop a request whose caller went away."""

        generate_subject = self.subjects.inference_generate("{base_model}", "{version}")
        broker.subscriber(generate_subject, queue="inference-{base_model}-{version}")(generate)
        broker.subscriber(self.subjects.inference_cancel("{request_id}"))(cancel)
        broker.publisher(
            self.subjects.inference_heartbeat("{worker_id}"),
            schema=CloudEvent[InferenceHeartbeat],
            description="every SWARM_HEARTBEAT_INTERVAL_S: device, base models, adapters, load",
        )

    # --- heartbeats ------------------------------------------------------------------------
    def _engine_stats(self) -> list[tuple[str, EngineStats]]:
        return [(held.ref, held.engine.stats()) for held in list(self.held.values())]

    def heartbeat(self) -> InferenceHeartbeat:
        stats = [h.engine.stats() for h in self.held.values()]
        return InferenceHeartbeat(
            worker_id=self.worker_id,
            device=_describe(self.device),
            backend="vllm" if self.settings.inference_backend == "vllm" else "swarm",
            base_models=[
                HeldModel(name=h.name, version=h.version, max_context=h.engine.max_context)
                for h in self.held.values()
            ],
            adapters_loaded=sorted({a for s in stats for a in s.adapters_loaded}),
            adapter_slots=sum(s.adapter_slots for s in stats),
            free_slots=sum(s.free_slots for s in stats),
            max_batch_size=self.settings.inference_max_batch_size,
            running=sum(s.running for s in stats),
            queue_depth=sum(s.queued for s in stats),
        )

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                beat = envelope(SERVICE, HEARTBEAT_TYPE, self.heartbeat(), self.worker_id)
                await self.broker.publish(beat, self.subjects.inference_heartbeat(self.worker_id))
            except Exception:  # a NATS hiccup must not end the heartbeats for good
                log.exception("heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat_interval_s)


def _json_floats(values: tuple[float, ...] | None) -> list[float | None] | None:
    """NaN (a value there is none of) as null: JSON has no NaN."""
    if values is None:
        return None
    return [None if math.isnan(v) else v for v in values]


def _texts_of(tokenizer: Any, prompt_ids: list[int], piece: Piece | Step) -> dict[int, str]:
    """The text of each generated token and of each alternative (as read after the prompt's
    last token)."""
    ids = [*piece.tokens, *(t for top in piece.top_logprobs or () for t, _ in top)]
    return token_texts(tokenizer, ids, anchor=prompt_ids[-1])


def _checked_tokens(tokens: list[int], vocab_size: int) -> list[int]:
    """A prompt of token ids, refused (400) with the first one the model does not know."""
    for i, token in enumerate(tokens):
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"prompt_tokens[{i}]: {token} is outside the vocabulary (0..{vocab_size - 1})"
            )
    return tokens


def _checked_targets(
    rows: list[list[int]] | None, vocab_size: int
) -> tuple[tuple[int, ...], ...] | None:
    """Target ids to score, refused (400) when one is not the model's (the engine gathers at
    them: one past its logits would fail the whole batch)."""
    if rows is None:
        return None
    for i, row in enumerate(rows):
        for j, token in enumerate(row):
            if token >= vocab_size:
                raise InvalidRequest(
                    f"prompt_target_ids[{i}][{j}]: {token} is outside the vocabulary "
                    f"(0..{vocab_size - 1})"
                )
    return tuple(tuple(row) for row in rows)


def _json_schema(request: GenerateRequest) -> dict[str, Any] | None:
    """The schema the text must match: None for free text."""
    if request.response_format == "json_object":
        return ANY_OBJECT
    return request.json_schema


def _describe(device: Any) -> str:
    if getattr(device, "type", None) == "cuda":
        index = device.index or 0
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)

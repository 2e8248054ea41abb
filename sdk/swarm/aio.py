"""``swarm.AsyncClient``: the async twin of ``swarm.Client`` on ``httpx.AsyncClient``.

Every request and every answer's parsing come from ``swarm.api``, errors from
``swarm.errors``, SSE parsing and reconnect bookkeeping from ``swarm.sse``: only the sending
differs from the sync client.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx

from swarm import api
from swarm.archive import BASE_DIR, extract_adapter, point_at_base
from swarm.client import SSE_TIMEOUT, auth_headers, model_files
from swarm.completions import TIMEOUT as COMPLETION_TIMEOUT
from swarm.completions import (
    Completion,
    CompletionChunk,
    Kind,
    Messages,
    Sampling,
    as_messages,
    read_completion,
    read_event,
)
from swarm.completions import body as completion_body
from swarm.config import resolve
from swarm.errors import ServiceUnavailableError, raise_for, unreachable
from swarm.sse import JobStreamEvent, Resume, SSEDecoder
from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.inference import InferenceHeartbeat
from swarm_contracts.jobs import JobRecord, JobSpec
from swarm_contracts.memory import MemoryEstimate
from swarm_contracts.metrics import JobMetrics
from swarm_contracts.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_contracts.sweeps import SweepDetail, SweepRecord, SweepSpec
from swarm_contracts.workers import WorkerBenchmark, WorkerInfo, WorkerOps

T = TypeVar("T")


class AsyncClient:
    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, timeout: float = 30.0
    ) -> None:
        conn = resolve(base_url, api_key)
        self.base_url = conn.gateway_url
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=auth_headers(conn.api_key), timeout=timeout
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _do(self, call: api.Call[T], **kwargs: Any) -> T:
        if call.timeout is not None:
            kwargs.setdefault("timeout", call.timeout)
        try:
            resp = await self.http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                headers=call.headers,
                **kwargs,
            )
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        raise_for(resp)
        return call.parse(resp)

    async def healthy(self) -> bool:
        try:
            return (await self.http.get("/healthz", timeout=2.0)).status_code == 200
        except httpx.TransportError:
            return False

    # --- jobs ------------------------------------------------------------------------
    async def submit(
        self,
        spec: dict[str, Any] | JobSpec,
        idempotency_key: str | None = None,
        *,
        from_checkpoint: str | None = None,
        from_checkpoint_optimizer: bool = False,
    ) -> JobRecord:
        """Submit a job. ``from_checkpoint`` (``JOB_ID@STEP``): start from that committed
        checkpoint of another of the tenant's jobs (a fork; its adapter weights, and with
        ``from_checkpoint_optimizer`` its optimizer state, schedule, step and data position
        too, so the new job continues that run). ``idempotency_key``: the same key, the
        same job."""
        call = api.submit(spec, idempotency_key, from_checkpoint, from_checkpoint_optimizer)
        return await self._do(call)

    async def estimate(self, spec: dict[str, Any] | JobSpec) -> MemoryEstimate:
        """The GPU memory a job would need per GPU (nothing is submitted)."""
        return await self._do(api.estimate(spec))

    async def get_job(self, job_id: str) -> JobRecord:
        return await self._do(api.get_job(job_id))

    async def list_jobs(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
        sweep: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        return await self._do(api.list_jobs(state, name, limit, cursor, tenant, sweep))

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRecord:
        return await self._do(api.cancel(job_id, reason))

    async def pause_job(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Pause a running job: its worker commits a checkpoint and hands it back, and the
        job stays ``paused`` (no worker, no capacity held) until ``resume_job``. The record
        answered is the one before (``paused`` comes within seconds; ``wait_state``). A job
        that is not running raises ``ValidationError`` (HTTP 409)."""
        return await self._do(api.pause(job_id, reason))

    async def resume_job(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Queue a paused job again, from the checkpoint it was paused at; a job that is
        not paused raises ``ValidationError`` (HTTP 409)."""
        return await self._do(api.resume(job_id, reason))

    async def verify_job(self, job_id: str) -> JobRecord:
        return await self._do(api.verify(job_id))

    async def metrics(self, job_id: str, max_points: int | None = None) -> JobMetrics:
        return await self._do(api.metrics(job_id, max_points))

    async def events(
        self, job_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> AsyncIterator[JobStreamEvent]:
        """The job's events until it ends, resuming with ``Last-Event-ID`` after a drop."""
        resume = Resume(api.job_events_path(job_id), last_event_id, max_reconnects)
        async for event in self._follow(resume):
            yield event

    async def _follow(self, resume: Resume) -> AsyncIterator[JobStreamEvent]:
        while True:
            try:
                async with self.http.stream(
                    "GET", resume.path, headers=resume.headers(), timeout=SSE_TIMEOUT
                ) as resp:
                    if not resp.is_success:
                        await resp.aread()
                        raise_for(resp)
                    decoder = SSEDecoder()
                    async for line in resp.aiter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        resume.seen(event)
                        yield event
                return
            except httpx.TransportError as exc:
                delay = resume.backoff()
                if delay is None:
                    raise ServiceUnavailableError(
                        f"lost the event stream {resume.path}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)

    async def wait_state(
        self, job_id: str, *states: str, timeout: float | None = None, poll_s: float = 0.5
    ) -> JobRecord:
        """Until the job is in one of ``states`` or has ended; TimeoutError after
        ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                record = await self.get_job(job_id)
                if record.state in states or record.state.terminal:
                    return record
                await asyncio.sleep(poll_s)

    async def wait(
        self, job_id: str, timeout: float | None = None, poll_s: float = 1.0
    ) -> JobRecord:
        """Until the job is terminal; TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                record = await self.get_job(job_id)
                if record.state.terminal:
                    return record
                await asyncio.sleep(poll_s)

    # --- sweeps ----------------------------------------------------------------------
    async def create_sweep(
        self, spec: dict[str, Any] | SweepSpec, idempotency_key: str | None = None
    ) -> SweepRecord:
        return await self._do(api.create_sweep(spec, idempotency_key))

    async def list_sweeps(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        tenant: str | None = None,
    ) -> list[SweepRecord]:
        return await self._do(api.list_sweeps(state, name, limit, tenant))

    async def get_sweep(self, sweep_id: str) -> SweepDetail:
        return await self._do(api.get_sweep(sweep_id))

    async def cancel_sweep(self, sweep_id: str, reason: str | None = None) -> SweepRecord:
        return await self._do(api.cancel_sweep(sweep_id, reason))

    async def sweep_events(
        self, sweep_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> AsyncIterator[JobStreamEvent]:
        """The sweep's events until it completes, fails or is cancelled."""
        path = api.sweep_events_path(sweep_id)
        resume = Resume(path, last_event_id, max_reconnects)
        async for event in self._follow(resume):
            yield event

    async def wait_sweep(
        self, sweep_id: str, timeout: float | None = None, poll_s: float = 1.0
    ) -> SweepDetail:
        """Until the sweep has ended; TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                sweep = await self.get_sweep(sweep_id)
                if sweep.state.terminal:
                    return sweep
                await asyncio.sleep(poll_s)

    # --- datasets --------------------------------------------------------------------
    async def upload_dataset(self, path: str | Path, name: str | None = None) -> DatasetInfo:
        return await self._upload(api.UPLOAD_DATASET, path, name)

    async def start_dataset_upload(
        self, path: str | Path, name: str | None = None
    ) -> DatasetUpload:
        """Send the file; the gateway checks it in the background (``dataset_upload``)."""
        return await self._upload(api.START_DATASET_UPLOAD, path, name)

    async def _upload(self, call: api.Call[T], path: str | Path, name: str | None) -> T:
        path = Path(path)
        label = api.label(name or path.name, "name")
        # httpx's multipart encoder wants a sync file object; reads from local disk are short.
        with open(path, "rb") as f:  # noqa: ASYNC230
            return await self._do(
                call,
                files={"file": (path.name, f, "application/jsonl")},
                data={"name": label},
            )

    async def dataset_upload(self, upload_id: str) -> DatasetUpload:
        """A background upload's progress, then its dataset (``state`` ready) or bad lines."""
        return await self._do(api.dataset_upload(upload_id))

    async def list_datasets(self) -> list[DatasetInfo]:
        return await self._do(api.list_datasets())

    async def get_dataset(self, dataset_id: str) -> DatasetInfo:
        return await self._do(api.get_dataset(dataset_id))

    async def dataset_stats(self, dataset_id: str, model: str | None = None) -> dict[str, Any]:
        return await self._do(api.dataset_stats(dataset_id, model))

    # --- models ----------------------------------------------------------------------
    async def add_model(
        self, name: str, directory: str | Path, hf_id: str | None = None
    ) -> ModelVersion:
        api.name(name, "model name")
        paths = model_files(Path(directory))
        # Closed below, all at once; httpx's multipart encoder wants sync file objects.
        handles = [open(p, "rb") for p in paths]  # noqa: SIM115, ASYNC230
        try:
            files = [("files", (p.name, h)) for p, h in zip(paths, handles, strict=True)]
            data = {"name": name} | ({"hf_id": hf_id} if hf_id else {})
            return await self._do(api.ADD_MODEL, data=data, files=files)
        finally:
            for h in handles:
                h.close()

    async def list_models(self) -> list[ModelVersion]:
        return await self._do(api.list_models())

    # --- adapters --------------------------------------------------------------------
    async def list_adapters(self, name: str | None = None) -> list[AdapterVersion]:
        return await self._do(api.list_adapters(name))

    async def get_adapter(self, name: str, version: int | None = None) -> AdapterVersion:
        return await self._do(api.get_adapter(name, version))

    async def adapter_lineage(self, name: str, version: int) -> dict[str, Any]:
        return await self._do(api.adapter_lineage(name, version))

    async def resolve_adapter(self, ref: str) -> AdapterVersion:
        """The version that ``ref`` names: ``name`` (latest), ``name@3`` or ``name@alias``."""
        return await self._do(api.resolve_adapter(ref))

    async def get_alias(self, name: str, alias: str) -> dict[str, Any]:
        return await self._do(api.get_alias(name, alias))

    async def set_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        return await self._do(api.set_alias(name, alias, version))

    async def export_adapter(self, name: str, version: int) -> ExportResult:
        """Merge the version into its base model; the merged model's store key and digests."""
        return await self._do(api.export_adapter(name, version))

    async def unquarantine_adapter(
        self, name: str, version: int, tenant: str | None = None
    ) -> AdapterVersion:
        return await self._do(api.unquarantine_adapter(name, version, tenant))

    async def delete_adapter_version(self, name: str, version: int) -> None:
        await self._do(api.delete_adapter_version(name, version))

    async def download_adapter(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch the version's PEFT files into directory ``dest``; return their paths."""
        return await self._download_tar(api.download_path(name, version), Path(dest))

    async def download_export(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch the merged model made by ``export_adapter`` into directory ``dest``."""
        return await self._download_tar(api.export_download_path(name, version), Path(dest))

    async def download_model(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch a base model version's ``from_pretrained`` files into directory ``dest``."""
        return await self._download_tar(api.model_download_path(name, version), Path(dest))

    async def pull_adapter_with_base(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """As ``Client.pull_adapter_with_base``: the adapter in ``dest``, its base model in
        ``dest/base``, loadable by stock ``AutoPeftModelForCausalLM.from_pretrained(dest)``."""
        dest = Path(dest)
        adapter = await self.get_adapter(name, version)
        base = adapter.lineage.base_model, adapter.lineage.base_model_version
        files = await self.download_adapter(name, version, dest)
        files += await self.download_model(*base, dest / BASE_DIR)
        await asyncio.to_thread(point_at_base, dest, dest / BASE_DIR)
        return files

    async def _download_tar(self, path: str, dest: Path) -> list[Path]:
        with tempfile.TemporaryDirectory(prefix="swarm-pull-") as tmp:
            tar_path = Path(tmp) / "files.tar"
            try:
                async with self.http.stream("GET", path, timeout=600.0) as resp:
                    if not resp.is_success:
                        await resp.aread()
                        raise_for(resp)
                    async with await anyio.open_file(tar_path, "wb") as out:
                        async for chunk in resp.aiter_bytes():
                            await out.write(chunk)
            except httpx.TransportError as exc:
                raise unreachable(self.base_url, exc) from exc
            return await asyncio.to_thread(extract_adapter, tar_path, dest)

    # --- workers ---------------------------------------------------------------------
    async def workers(self) -> list[WorkerInfo]:
        return await self._do(api.workers())

    async def cordon_worker(self, worker_id: str, reason: str = "") -> WorkerOps:
        return await self._do(api.cordon_worker(worker_id, reason))

    async def uncordon_worker(self, worker_id: str) -> WorkerOps:
        return await self._do(api.uncordon_worker(worker_id))

    async def clear_worker(self, worker_id: str) -> WorkerOps:
        return await self._do(api.clear_worker(worker_id))

    async def drain_worker(
        self, worker_id: str, move_jobs: bool = False, reason: str = ""
    ) -> WorkerOps:
        return await self._do(api.drain_worker(worker_id, move_jobs, reason))

    async def benchmark_worker(self, worker_id: str) -> WorkerBenchmark:
        return await self._do(api.benchmark_worker(worker_id))

    async def inference_workers(self) -> list[InferenceHeartbeat]:
        return await self._do(api.inference_workers())

    # --- inference (OpenAI-compatible routes) -----------------------------------------
    async def served_models(self) -> list[dict[str, Any]]:
        return await self._do(api.served_models())

    async def chat(
        self,
        model: str,
        messages: Messages,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
    ) -> Completion:
        return await self._complete(
            "chat",
            model,
            as_messages(messages, system),
            Sampling(max_tokens, temperature, top_p, stop, seed),
        )

    def chat_stream(
        self,
        model: str,
        messages: Messages,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
    ) -> AsyncIterator[CompletionChunk]:
        return self._stream(
            "chat",
            model,
            as_messages(messages, system),
            Sampling(max_tokens, temperature, top_p, stop, seed),
        )

    async def complete(
        self,
        model: str,
        prompt: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
    ) -> Completion:
        return await self._complete(
            "text", model, prompt, Sampling(max_tokens, temperature, top_p, stop, seed)
        )

    def complete_stream(
        self,
        model: str,
        prompt: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
    ) -> AsyncIterator[CompletionChunk]:
        return self._stream(
            "text", model, prompt, Sampling(max_tokens, temperature, top_p, stop, seed)
        )

    async def _complete(
        self, kind: Kind, model: str, content: Any, sampling: Sampling
    ) -> Completion:
        path, payload = completion_body(kind, model, content, sampling, stream=False)
        try:
            resp = await self.http.post(path, json=payload, timeout=COMPLETION_TIMEOUT)
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        return read_completion(resp)

    async def _stream(
        self, kind: Kind, model: str, content: Any, sampling: Sampling
    ) -> AsyncIterator[CompletionChunk]:
        path, payload = completion_body(kind, model, content, sampling, stream=True)
        try:
            async with self.http.stream(
                "POST", path, json=payload, timeout=COMPLETION_TIMEOUT
            ) as resp:
                if not resp.is_success:
                    await resp.aread()
                    raise_for(resp)
                async for line in resp.aiter_lines():
                    chunk = read_event(line)
                    if chunk is not None:
                        yield chunk
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc

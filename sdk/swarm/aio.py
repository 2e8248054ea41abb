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

import httpx

from swarm import api
from swarm.archive import extract_adapter
from swarm.client import SSE_TIMEOUT, auth_headers, model_files
from swarm.config import resolve
from swarm.errors import ServiceUnavailableError, raise_for, unreachable
from swarm.sse import JobStreamEvent, Resume, SSEDecoder
from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobRecord, JobSpec
from swarm_common.metrics import JobMetrics
from swarm_common.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_common.workers import WorkerInfo

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
        self, spec: dict[str, Any] | JobSpec, idempotency_key: str | None = None
    ) -> JobRecord:
        return await self._do(api.submit(spec, idempotency_key))

    async def get_job(self, job_id: str) -> JobRecord:
        return await self._do(api.get_job(job_id))

    async def list_jobs(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        return await self._do(api.list_jobs(state, name, limit, cursor, tenant))

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRecord:
        return await self._do(api.cancel(job_id, reason))

    async def metrics(self, job_id: str, max_points: int | None = None) -> JobMetrics:
        return await self._do(api.metrics(job_id, max_points))

    async def events(
        self, job_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> AsyncIterator[JobStreamEvent]:
        """The job's events until it ends, resuming with ``Last-Event-ID`` after a drop."""
        resume = Resume(job_id, last_event_id, max_reconnects)
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
                        if event.terminal:
                            return
                return
            except httpx.TransportError as exc:
                delay = resume.backoff()
                if delay is None:
                    raise ServiceUnavailableError(
                        f"lost the event stream of {job_id}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)

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

    # --- datasets --------------------------------------------------------------------
    async def upload_dataset(self, path: str | Path, name: str | None = None) -> DatasetInfo:
        path = Path(path)
        with open(path, "rb") as f:
            return await self._do(
                api.UPLOAD_DATASET,
                files={"file": (path.name, f, "application/jsonl")},
                data={"name": name or path.name},
            )

    async def list_datasets(self) -> list[DatasetInfo]:
        return await self._do(api.list_datasets())

    async def get_dataset(self, dataset_id: str) -> DatasetInfo:
        return await self._do(api.get_dataset(dataset_id))

    async def dataset_stats(self, dataset_id: str, model: str | None = None) -> dict[str, Any]:
        return await self._do(api.dataset_stats(dataset_id, model))

    # --- models ----------------------------------------------------------------------
    async def add_model(self, name: str, directory: str | Path) -> ModelVersion:
        paths = model_files(Path(directory))
        handles = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed below, all at once
        try:
            files = [("files", (p.name, h)) for p, h in zip(paths, handles, strict=True)]
            return await self._do(api.ADD_MODEL, data={"name": name}, files=files)
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

    async def get_alias(self, name: str, alias: str) -> dict[str, Any]:
        return await self._do(api.get_alias(name, alias))

    async def set_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        return await self._do(api.set_alias(name, alias, version))

    async def export_adapter(self, name: str, version: int) -> ExportResult:
        """Merge the version into its base model; the merged model's store key and digests."""
        return await self._do(api.export_adapter(name, version))

    async def delete_adapter_version(self, name: str, version: int) -> None:
        await self._do(api.delete_adapter_version(name, version))

    async def download_adapter(self, name: str, version: int, dest: str | Path) -> list[Path]:
        with tempfile.TemporaryDirectory(prefix="swarm-pull-") as tmp:
            tar_path = Path(tmp) / "adapter.tar"
            try:
                async with self.http.stream(
                    "GET", api.download_path(name, version), timeout=600.0
                ) as resp:
                    if not resp.is_success:
                        await resp.aread()
                        raise_for(resp)
                    with open(tar_path, "wb") as out:
                        async for chunk in resp.aiter_bytes():
                            out.write(chunk)
            except httpx.TransportError as exc:
                raise unreachable(self.base_url, exc) from exc
            return await asyncio.to_thread(extract_adapter, tar_path, Path(dest))

    # --- workers ---------------------------------------------------------------------
    async def workers(self) -> list[WorkerInfo]:
        return await self._do(api.workers())

"""A synchronous client for the gateway's HTTP API (v1). ``swarm.AsyncClient`` is its twin.

Requests and parsing live in ``swarm.api`` and errors in ``swarm.errors``, shared by both.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from swarm import api
from swarm.archive import extract_adapter
from swarm.config import resolve
from swarm.errors import (
    AuthError,
    NotFoundError,
    ServiceUnavailableError,
    SwarmError,
    ValidationError,
    describe_detail,
    raise_for,
    unreachable,
)
from swarm.sse import JobStreamEvent, Resume, SSEDecoder
from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobRecord, JobSpec
from swarm_common.metrics import JobMetrics
from swarm_common.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_common.workers import WorkerInfo

__all__ = [
    "AuthError",
    "Client",
    "JobStreamEvent",
    "NotFoundError",
    "ServiceUnavailableError",
    "SwarmError",
    "ValidationError",
    "describe_detail",
]

T = TypeVar("T")
SSE_TIMEOUT = httpx.Timeout(10.0, read=60.0)  # the gateway pings every 10 s


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def model_files(directory: Path) -> list[Path]:
    paths = sorted(p for p in Path(directory).iterdir() if p.is_file())
    if not paths:
        raise ValidationError(f"{directory} holds no files")
    return paths


class Client:
    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, timeout: float = 30.0
    ) -> None:
        conn = resolve(base_url, api_key)
        self.base_url = conn.gateway_url
        self.http = httpx.Client(
            base_url=self.base_url, headers=auth_headers(conn.api_key), timeout=timeout
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        raise_for(resp)
        return resp

    def _do(self, call: api.Call[T], **kwargs: Any) -> T:
        if call.timeout is not None:
            kwargs.setdefault("timeout", call.timeout)
        resp = self._request(
            call.method,
            call.path,
            params=call.params,
            json=call.json,
            headers=call.headers,
            **kwargs,
        )
        return call.parse(resp)

    # --- health ----------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    # --- jobs ------------------------------------------------------------------------
    def submit(
        self, spec: dict[str, Any] | JobSpec, idempotency_key: str | None = None
    ) -> JobRecord:
        return self._do(api.submit(spec, idempotency_key))

    def get_job(self, job_id: str) -> JobRecord:
        return self._do(api.get_job(job_id))

    def list_jobs(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """One page of the caller's jobs, newest first, and the cursor of the next page."""
        return self._do(api.list_jobs(state, name, limit, cursor, tenant))

    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord:
        return self._do(api.cancel(job_id, reason))

    def metrics(self, job_id: str, max_points: int | None = None) -> JobMetrics:
        return self._do(api.metrics(job_id, max_points))

    def events(
        self, job_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> Iterator[JobStreamEvent]:
        """The job's events from the first (or after ``last_event_id``) until it ends.

        A dropped connection is resumed with ``Last-Event-ID``, so no event is lost or repeated.
        """
        resume = Resume(job_id, last_event_id, max_reconnects)
        while True:
            try:
                with self.http.stream(
                    "GET", resume.path, headers=resume.headers(), timeout=SSE_TIMEOUT
                ) as resp:
                    if not resp.is_success:
                        resp.read()
                        raise_for(resp)
                    decoder = SSEDecoder()
                    for line in resp.iter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        resume.seen(event)
                        yield event
                        if event.terminal:
                            return
                # The server ends the stream only once the job is over.
                return
            except httpx.TransportError as exc:
                delay = resume.backoff()
                if delay is None:
                    raise ServiceUnavailableError(
                        f"lost the event stream of {job_id}: {exc}"
                    ) from exc
                time.sleep(delay)

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 1.0) -> JobRecord:
        """Block until the job is terminal; raise TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self.get_job(job_id)
            if record.state.terminal:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {record.state} after {timeout}s")
            time.sleep(poll_s)

    # --- datasets --------------------------------------------------------------------
    def upload_dataset(self, path: str | Path, name: str | None = None) -> DatasetInfo:
        path = Path(path)
        with open(path, "rb") as f:
            return self._do(
                api.UPLOAD_DATASET,
                files={"file": (path.name, f, "application/jsonl")},
                data={"name": name or path.name},
            )

    def list_datasets(self) -> list[DatasetInfo]:
        return self._do(api.list_datasets())

    def get_dataset(self, dataset_id: str) -> DatasetInfo:
        return self._do(api.get_dataset(dataset_id))

    def dataset_stats(self, dataset_id: str, model: str | None = None) -> dict[str, Any]:
        """Examples and length percentiles; token lengths with ``model``'s tokenizer."""
        return self._do(api.dataset_stats(dataset_id, model))

    # --- models ----------------------------------------------------------------------
    def add_model(self, name: str, directory: str | Path) -> ModelVersion:
        """Upload a HF ``save_pretrained`` directory (flat; safetensors weights only)."""
        paths = model_files(Path(directory))
        handles = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed below, all at once
        try:
            files = [("files", (p.name, h)) for p, h in zip(paths, handles, strict=True)]
            return self._do(api.ADD_MODEL, data={"name": name}, files=files)
        finally:
            for h in handles:
                h.close()

    def list_models(self) -> list[ModelVersion]:
        return self._do(api.list_models())

    # --- adapters --------------------------------------------------------------------
    def list_adapters(self, name: str | None = None) -> list[AdapterVersion]:
        return self._do(api.list_adapters(name))

    def get_adapter(self, name: str, version: int | None = None) -> AdapterVersion:
        return self._do(api.get_adapter(name, version))

    def adapter_lineage(self, name: str, version: int) -> dict[str, Any]:
        return self._do(api.adapter_lineage(name, version))

    def get_alias(self, name: str, alias: str) -> dict[str, Any]:
        return self._do(api.get_alias(name, alias))

    def set_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        return self._do(api.set_alias(name, alias, version))

    def export_adapter(self, name: str, version: int) -> ExportResult:
        """Merge the version into its base model; the merged model's store key and digests."""
        return self._do(api.export_adapter(name, version))

    def delete_adapter_version(self, name: str, version: int) -> None:
        self._do(api.delete_adapter_version(name, version))

    def download_adapter(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch the version's PEFT files into directory ``dest``; return their paths."""
        with tempfile.TemporaryDirectory(prefix="swarm-pull-") as tmp:
            tar_path = Path(tmp) / "adapter.tar"
            try:
                with self.http.stream(
                    "GET", api.download_path(name, version), timeout=600.0
                ) as resp:
                    if not resp.is_success:
                        resp.read()
                        raise_for(resp)
                    with open(tar_path, "wb") as out:
                        for chunk in resp.iter_bytes():
                            out.write(chunk)
            except httpx.TransportError as exc:
                raise unreachable(self.base_url, exc) from exc
            return extract_adapter(tar_path, Path(dest))

    # --- workers ---------------------------------------------------------------------
    def workers(self) -> list[WorkerInfo]:
        return self._do(api.workers())

"""A synchronous client for the gateway's HTTP API (v1). ``swarm.AsyncClient`` is its twin.

Requests and parsing live in ``swarm.api`` and errors in ``swarm.errors``, shared by both.

Long because: one method for each of the gateway's endpoints (jobs and their control, sweeps,
datasets, models, adapters, workers, completions), the SDK's one page for users, kept
method for method beside its async twin; what is not sending already lives elsewhere.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from swarm import api
from swarm.archive import BASE_DIR, extract_adapter, point_at_base
from swarm.completions import (
    TIMEOUT as COMPLETION_TIMEOUT,
)
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
from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.inference import InferenceHeartbeat
from swarm_contracts.jobs import JobRecord, JobSpec
from swarm_contracts.memory import MemoryEstimate
from swarm_contracts.metrics import JobMetrics
from swarm_contracts.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_contracts.sweeps import SweepDetail, SweepRecord, SweepSpec
from swarm_contracts.workers import WorkerBenchmark, WorkerInfo, WorkerOps

__all__ = [
    "AuthError",
    "Client",
    "Completion",
    "CompletionChunk",
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
        return self._do(call)

    def estimate(self, spec: dict[str, Any] | JobSpec) -> MemoryEstimate:
        """The GPU memory a job would need per GPU (nothing is submitted)."""
        return self._do(api.estimate(spec))

    def get_job(self, job_id: str) -> JobRecord:
        return self._do(api.get_job(job_id))

    def list_jobs(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
        sweep: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """One page of the caller's jobs, newest first, and the cursor of the next page;
        ``sweep``: only that sweep's trials."""
        return self._do(api.list_jobs(state, name, limit, cursor, tenant, sweep))

    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord:
        return self._do(api.cancel(job_id, reason))

    def pause_job(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Pause a running job: its worker commits a checkpoint and hands it back, and the
        job stays ``paused`` (no worker, no capacity held) until ``resume_job``. The record
        answered is the one before (``paused`` comes within seconds; ``wait_state``). A job
        that is not running raises ``ValidationError`` (HTTP 409)."""
        return self._do(api.pause(job_id, reason))

    def resume_job(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Queue a paused job again, from the checkpoint it was paused at; a job that is
        not paused raises ``ValidationError`` (HTTP 409)."""
        return self._do(api.resume(job_id, reason))

    def verify_job(self, job_id: str) -> JobRecord:
        """Replay part of the succeeded job on another worker and compare; the outcome comes
        as its ``verified`` event and in the record's ``verification``."""
        return self._do(api.verify(job_id))

    def metrics(self, job_id: str, max_points: int | None = None) -> JobMetrics:
        return self._do(api.metrics(job_id, max_points))

    def events(
        self, job_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> Iterator[JobStreamEvent]:
        """The job's events from the first (or after ``last_event_id``) until it ends.

        A dropped connection is resumed with ``Last-Event-ID``, so no event is lost or repeated.
        """
        yield from self._follow(Resume(api.job_events_path(job_id), last_event_id, max_reconnects))

    def _follow(self, resume: Resume) -> Iterator[JobStreamEvent]:
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
                # The server ends the stream only once it is over.
                return
            except httpx.TransportError as exc:
                delay = resume.backoff()
                if delay is None:
                    raise ServiceUnavailableError(
                        f"lost the event stream {resume.path}: {exc}"
                    ) from exc
                time.sleep(delay)

    def wait_state(
        self, job_id: str, *states: str, timeout: float | None = None, poll_s: float = 0.5
    ) -> JobRecord:
        """Block until the job is in one of ``states`` (``"paused"`` after ``pause_job``, say)
        or has ended; raise TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self.get_job(job_id)
            if record.state in states or record.state.terminal:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {record.state} after {timeout}s")
            time.sleep(poll_s)

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

    # --- sweeps ----------------------------------------------------------------------
    def create_sweep(
        self, spec: dict[str, Any] | SweepSpec, idempotency_key: str | None = None
    ) -> SweepRecord:
        """Start a hyperparameter sweep; the same ``idempotency_key`` never makes a second."""
        return self._do(api.create_sweep(spec, idempotency_key))

    def list_sweeps(
        self,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        tenant: str | None = None,
    ) -> list[SweepRecord]:
        return self._do(api.list_sweeps(state, name, limit, tenant))

    def get_sweep(self, sweep_id: str) -> SweepDetail:
        """The sweep with its trials table."""
        return self._do(api.get_sweep(sweep_id))

    def cancel_sweep(self, sweep_id: str, reason: str | None = None) -> SweepRecord:
        return self._do(api.cancel_sweep(sweep_id, reason))

    def sweep_events(
        self, sweep_id: str, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> Iterator[JobStreamEvent]:
        """The sweep's events (created, trial_started, …) until it completes, fails or is
        cancelled; resumed with ``Last-Event-ID`` after a drop."""
        path = api.sweep_events_path(sweep_id)
        yield from self._follow(Resume(path, last_event_id, max_reconnects))

    def wait_sweep(
        self, sweep_id: str, timeout: float | None = None, poll_s: float = 1.0
    ) -> SweepDetail:
        """Block until the sweep has ended; raise TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sweep = self.get_sweep(sweep_id)
            if sweep.state.terminal:
                return sweep
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"sweep {sweep_id} still {sweep.state} after {timeout}s")
            time.sleep(poll_s)

    # --- datasets --------------------------------------------------------------------
    def upload_dataset(self, path: str | Path, name: str | None = None) -> DatasetInfo:
        return self._upload(api.UPLOAD_DATASET, path, name)

    def start_dataset_upload(self, path: str | Path, name: str | None = None) -> DatasetUpload:
        """Send the file; the gateway checks it in the background (``dataset_upload``)."""
        return self._upload(api.START_DATASET_UPLOAD, path, name)

    def _upload(self, call: api.Call[T], path: str | Path, name: str | None) -> T:
        path = Path(path)
        label = api.label(name or path.name, "name")
        with open(path, "rb") as f:
            return self._do(
                call,
                files={"file": (path.name, f, "application/jsonl")},
                data={"name": label},
            )

    def dataset_upload(self, upload_id: str) -> DatasetUpload:
        """A background upload's progress, then its dataset (``state`` ready) or bad lines."""
        return self._do(api.dataset_upload(upload_id))

    def list_datasets(self) -> list[DatasetInfo]:
        return self._do(api.list_datasets())

    def get_dataset(self, dataset_id: str) -> DatasetInfo:
        return self._do(api.get_dataset(dataset_id))

    def dataset_stats(self, dataset_id: str, model: str | None = None) -> dict[str, Any]:
        """Examples and length percentiles; token lengths with ``model``'s tokenizer."""
        return self._do(api.dataset_stats(dataset_id, model))

    # --- models ----------------------------------------------------------------------
    def add_model(self, name: str, directory: str | Path, hf_id: str | None = None) -> ModelVersion:
        """Upload a HF ``save_pretrained`` directory (flat; safetensors weights only);
        ``hf_id``: the Hub id it came from, which adapters trained on it will name."""
        api.name(name, "model name")
        paths = model_files(Path(directory))
        handles = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed below, all at once
        try:
            files = [("files", (p.name, h)) for p, h in zip(paths, handles, strict=True)]
            data = {"name": name} | ({"hf_id": hf_id} if hf_id else {})
            return self._do(api.ADD_MODEL, data=data, files=files)
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

    def resolve_adapter(self, ref: str) -> AdapterVersion:
        """The version that ``ref`` names: ``name`` (latest), ``name@3`` or ``name@alias``."""
        return self._do(api.resolve_adapter(ref))

    def get_alias(self, name: str, alias: str) -> dict[str, Any]:
        return self._do(api.get_alias(name, alias))

    def set_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        return self._do(api.set_alias(name, alias, version))

    def export_adapter(self, name: str, version: int) -> ExportResult:
        """Merge the version into its base model; the merged model's store key and digests."""
        return self._do(api.export_adapter(name, version))

    def unquarantine_adapter(
        self, name: str, version: int, tenant: str | None = None
    ) -> AdapterVersion:
        """Admins: release a version from quarantine (its job's verification had failed)."""
        return self._do(api.unquarantine_adapter(name, version, tenant))

    def delete_adapter_version(self, name: str, version: int) -> None:
        self._do(api.delete_adapter_version(name, version))

    def download_adapter(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch the version's PEFT files into directory ``dest``; return their paths."""
        return self._download_tar(api.download_path(name, version), Path(dest))

    def download_export(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch the merged model made by ``export_adapter`` into directory ``dest``
        (``AutoModelForCausalLM.from_pretrained(dest)`` loads it)."""
        return self._download_tar(api.export_download_path(name, version), Path(dest))

    def download_model(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """Fetch a base model version's ``from_pretrained`` files into directory ``dest``."""
        return self._download_tar(api.model_download_path(name, version), Path(dest))

    def pull_adapter_with_base(self, name: str, version: int, dest: str | Path) -> list[Path]:
        """The adapter's PEFT files in ``dest`` and its base model in ``dest/base``, with
        ``base_model_name_or_path`` pointing there: stock
        ``AutoPeftModelForCausalLM.from_pretrained(dest)`` loads it as it is."""
        dest = Path(dest)
        adapter = self.get_adapter(name, version)
        base = adapter.lineage.base_model, adapter.lineage.base_model_version
        files = self.download_adapter(name, version, dest)
        files += self.download_model(*base, dest / BASE_DIR)
        point_at_base(dest, dest / BASE_DIR)
        return files

    def _download_tar(self, path: str, dest: Path) -> list[Path]:
        with tempfile.TemporaryDirectory(prefix="swarm-pull-") as tmp:
            tar_path = Path(tmp) / "files.tar"
            try:
                with self.http.stream("GET", path, timeout=600.0) as resp:
                    if not resp.is_success:
                        resp.read()
                        raise_for(resp)
                    with open(tar_path, "wb") as out:
                        for chunk in resp.iter_bytes():
                            out.write(chunk)
            except httpx.TransportError as exc:
                raise unreachable(self.base_url, exc) from exc
            return extract_adapter(tar_path, dest)

    # --- workers ---------------------------------------------------------------------
    def workers(self) -> list[WorkerInfo]:
        return self._do(api.workers())

    def cordon_worker(self, worker_id: str, reason: str = "") -> WorkerOps:
        """No new jobs on the worker; running ones go on (admin key). Until ``uncordon``."""
        return self._do(api.cordon_worker(worker_id, reason))

    def uncordon_worker(self, worker_id: str) -> WorkerOps:
        """The worker takes jobs again (ends a cordon or a drain; admin key)."""
        return self._do(api.uncordon_worker(worker_id))

    def clear_worker(self, worker_id: str) -> WorkerOps:
        """Clear the suspicion a failed verification put on the worker (admin key)."""
        return self._do(api.clear_worker(worker_id))

    def drain_worker(self, worker_id: str, move_jobs: bool = False, reason: str = "") -> WorkerOps:
        """No new jobs; running ones finish, or with ``move_jobs`` are checkpointed and resumed
        on other workers (admin key)."""
        return self._do(api.drain_worker(worker_id, move_jobs, reason))

    def benchmark_worker(self, worker_id: str) -> WorkerBenchmark:
        """The worker runs its self-benchmark again and answers with the result (admin key);
        its heartbeats, and so ``workers()``, carry it from then on."""
        return self._do(api.benchmark_worker(worker_id))

    def inference_workers(self) -> list[InferenceHeartbeat]:
        """The inference workers' latest heartbeats (admin key)."""
        return self._do(api.inference_workers())

    # --- inference (OpenAI-compatible routes) -----------------------------------------
    def served_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: base models and the caller's adapters, each with ``id`` (what
        to pass as ``model``) and ``served`` (a live inference worker holds its base)."""
        return self._do(api.served_models())

    def chat(
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
        """The answer of ``model`` (a base model, or an adapter: ``bot``, ``bot@3``,
        ``bot@production``) to ``messages`` (a string is one user message)."""
        return self._complete(
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
    ) -> Iterator[CompletionChunk]:
        """``chat``, piece by piece; the last chunk has ``finish_reason`` and ``usage``."""
        return self._stream(
            "chat",
            model,
            as_messages(messages, system),
            Sampling(max_tokens, temperature, top_p, stop, seed),
        )

    def complete(
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
        """A text completion of ``prompt`` (no chat template)."""
        return self._complete(
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
    ) -> Iterator[CompletionChunk]:
        return self._stream(
            "text", model, prompt, Sampling(max_tokens, temperature, top_p, stop, seed)
        )

    def _complete(self, kind: Kind, model: str, content: Any, sampling: Sampling) -> Completion:
        path, payload = completion_body(kind, model, content, sampling, stream=False)
        return read_completion(
            self._request("POST", path, json=payload, timeout=COMPLETION_TIMEOUT)
        )

    def _stream(
        self, kind: Kind, model: str, content: Any, sampling: Sampling
    ) -> Iterator[CompletionChunk]:
        path, payload = completion_body(kind, model, content, sampling, stream=True)
        try:
            with self.http.stream("POST", path, json=payload, timeout=COMPLETION_TIMEOUT) as resp:
                if not resp.is_success:
                    resp.read()
                    raise_for(resp)
                for line in resp.iter_lines():
                    chunk = read_event(line)
                    if chunk is not None:
                        yield chunk
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc

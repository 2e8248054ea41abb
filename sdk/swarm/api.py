"""The gateway's HTTP API as data: each function says which request to send and how to read
the answer. ``Client`` (sync) and ``AsyncClient`` (async) only send these, so the two can
never disagree about paths, parameters or parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from swarm.errors import ValidationError
from swarm_contracts.datasets import DatasetInfo, DatasetUpload
from swarm_contracts.inference import InferenceHeartbeat
from swarm_contracts.jobs import JobRecord, JobSpec
from swarm_contracts.memory import MemoryEstimate
from swarm_contracts.metrics import JobMetrics
from swarm_contracts.names import check_label, check_name
from swarm_contracts.refs import Ref
from swarm_contracts.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_contracts.sweeps import SweepDetail, SweepRecord, SweepSpec
from swarm_contracts.workers import WorkerBenchmark, WorkerInfo, WorkerOps

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None


def _one(model: type[M]) -> Callable[[httpx.Response], M]:
    return lambda resp: model.model_validate(resp.json())


def _many(model: type[M]) -> Callable[[httpx.Response], list[M]]:
    return lambda resp: [model.model_validate(x) for x in resp.json()["data"]]


def _json(resp: httpx.Response) -> Any:
    return resp.json()


def _nothing(_: httpx.Response) -> None:
    return None


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def name(value: str, what: str) -> str:
    """``value`` if it is a valid name (``swarm_contracts.names``, the gateway's own rule):
    a bad one is refused here, before it can become part of a request path."""
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise ValidationError(str(exc), detail=[{"loc": [what], "msg": str(exc)}]) from None


def label(value: str, what: str) -> str:
    """``value`` if it is a valid label (``swarm_contracts.names``)."""
    try:
        return check_label(value, what)
    except ValueError as exc:
        raise ValidationError(str(exc), detail=[{"loc": [what], "msg": str(exc)}]) from None


# --- jobs ---------------------------------------------------------------------------------


def submit(
    spec: dict[str, Any] | JobSpec,
    idempotency_key: str | None,
    from_checkpoint: str | None = None,
    from_checkpoint_optimizer: bool = False,
) -> Call[JobRecord]:
    """``from_checkpoint`` (``JOB_ID@STEP``), when given, is set on the spec: the job starts
    from that committed checkpoint of another job (with its optimizer state and the rest of
    the run's training state too, given ``from_checkpoint_optimizer``)."""
    body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else dict(spec)
    if from_checkpoint is not None:
        body["from_checkpoint"] = from_checkpoint
        body["from_checkpoint_optimizer"] = from_checkpoint_optimizer
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/jobs", _one(JobRecord), json=body, headers=headers)


def estimate(spec: dict[str, Any] | JobSpec) -> Call[MemoryEstimate]:
    body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
    return Call("POST", "/v1/jobs/estimate", _one(MemoryEstimate), json=body)


def get_job(job_id: str) -> Call[JobRecord]:
    return Call("GET", f"/v1/jobs/{job_id}", _one(JobRecord))


def _job_page(resp: httpx.Response) -> tuple[list[JobRecord], str | None]:
    body = resp.json()
    return [JobRecord.model_validate(j) for j in body["data"]], body.get("next_cursor")


def list_jobs(
    state: str | None,
    name: str | None,
    limit: int,
    cursor: str | None,
    tenant: str | None = None,
    sweep: str | None = None,
) -> Call[tuple[list[JobRecord], str | None]]:
    params = _params(state=state, name=name, limit=limit, cursor=cursor, tenant=tenant, sweep=sweep)
    return Call("GET", "/v1/jobs", _job_page, params=params)


def cancel(job_id: str, reason: str | None) -> Call[JobRecord]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _one(JobRecord), params=_params(reason=reason))


def pause(job_id: str, reason: str | None) -> Call[JobRecord]:
    return Call("POST", f"/v1/jobs/{job_id}/pause", _one(JobRecord), params=_params(reason=reason))


def resume(job_id: str, reason: str | None) -> Call[JobRecord]:
    path = f"/v1/jobs/{job_id}/resume"
    return Call("POST", path, _one(JobRecord), params=_params(reason=reason))


def verify(job_id: str) -> Call[JobRecord]:
    return Call("POST", f"/v1/jobs/{job_id}/verify", _one(JobRecord))


def metrics(job_id: str, max_points: int | None) -> Call[JobMetrics]:
    params = _params(max_points=max_points)
    return Call("GET", f"/v1/jobs/{job_id}/metrics", _one(JobMetrics), params=params)


def job_events_path(job_id: str) -> str:
    """Server-Sent Events, streamed: no ``Call`` for it."""
    return f"/v1/jobs/{job_id}/events"


# --- sweeps -------------------------------------------------------------------------------


def create_sweep(
    spec: dict[str, Any] | SweepSpec, idempotency_key: str | None
) -> Call[SweepRecord]:
    body = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, SweepSpec) else spec
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/sweeps", _one(SweepRecord), json=body, headers=headers)


def list_sweeps(
    state: str | None, name: str | None, limit: int, tenant: str | None = None
) -> Call[list[SweepRecord]]:
    params = _params(state=state, name=name, limit=limit, tenant=tenant)
    return Call("GET", "/v1/sweeps", _many(SweepRecord), params=params)


def get_sweep(sweep_id: str) -> Call[SweepDetail]:
    return Call("GET", f"/v1/sweeps/{sweep_id}", _one(SweepDetail))


def cancel_sweep(sweep_id: str, reason: str | None) -> Call[SweepRecord]:
    path = f"/v1/sweeps/{sweep_id}/cancel"
    return Call("POST", path, _one(SweepRecord), params=_params(reason=reason))


def sweep_events_path(sweep_id: str) -> str:
    return f"/v1/sweeps/{sweep_id}/events"


# --- datasets -----------------------------------------------------------------------------


def list_datasets() -> Call[list[DatasetInfo]]:
    return Call("GET", "/v1/datasets", _many(DatasetInfo))


def get_dataset(dataset_id: str) -> Call[DatasetInfo]:
    return Call("GET", f"/v1/datasets/{dataset_id}", _one(DatasetInfo))


def dataset_stats(dataset_id: str, model: str | None) -> Call[dict[str, Any]]:
    params = _params(model=model)
    return Call("GET", f"/v1/datasets/{dataset_id}/stats", _json, params=params, timeout=300.0)


UPLOAD_DATASET = Call("POST", "/v1/datasets", _one(DatasetInfo), timeout=300.0)
# Answered once the file is received (202); the check goes on at the gateway.
START_DATASET_UPLOAD = Call(
    "POST", "/v1/datasets", _one(DatasetUpload), params={"background": "true"}, timeout=300.0
)


def dataset_upload(upload_id: str) -> Call[DatasetUpload]:
    return Call("GET", f"/v1/datasets/uploads/{upload_id}", _one(DatasetUpload))


ADD_MODEL = Call("POST", "/v1/models", _one(ModelVersion), timeout=600.0)


# --- models -------------------------------------------------------------------------------


def list_models() -> Call[list[ModelVersion]]:
    # /v1/models is also OpenAI's model list (adapters included): the catalog is kind=base_model.
    return Call("GET", "/v1/models", _base_models, params={"kind": "base_model"})


def _base_models(resp: httpx.Response) -> list[ModelVersion]:
    return [
        ModelVersion.model_validate(x)
        for x in resp.json()["data"]
        if x.get("kind", "base_model") == "base_model"
    ]


def served_models() -> Call[list[dict[str, Any]]]:
    """Every entry of /v1/models: base models and the caller's adapters, with ``served``."""
    return Call("GET", "/v1/models", lambda resp: list(resp.json()["data"]))


def model_download_path(model: str, version: int) -> str:
    """A tar of a base model version's files; streamed, so there is no ``Call`` for it."""
    return f"/v1/models/{name(model, 'model name')}/versions/{version}/download"


# --- adapters -----------------------------------------------------------------------------


def _adapter_path(adapter: str, version: int | None = None) -> str:
    path = f"/v1/adapters/{name(adapter, 'adapter name')}"
    return path + (f"/versions/{version}" if version is not None else "")


def list_adapters(name: str | None) -> Call[list[AdapterVersion]]:
    return Call("GET", "/v1/adapters", _many(AdapterVersion), params=_params(name=name))


def get_adapter(name: str, version: int | None) -> Call[AdapterVersion]:
    return Call("GET", _adapter_path(name, version), _one(AdapterVersion))


def adapter_lineage(name: str, version: int) -> Call[dict[str, Any]]:
    return Call("GET", _adapter_path(name, version) + "/lineage", _json)


def resolve_adapter(ref: str) -> Call[AdapterVersion]:
    """The adapter version that ``ref`` names: ``name`` (the latest), ``name@3`` or
    ``name@alias``, read by the same parser (``swarm_contracts.refs.Ref``) as the gateway's
    chat and completions. A malformed reference is refused here, naming the field."""
    try:
        parsed = Ref.parse(ref)
    except ValueError as exc:
        raise ValidationError(str(exc), detail=[{"loc": ["adapter"], "msg": str(exc)}]) from None
    if parsed.alias is not None:
        return Call("GET", _alias_path(parsed.name, parsed.alias), _one(AdapterVersion))
    return get_adapter(parsed.name, parsed.version)


def _alias_path(adapter: str, alias: str) -> str:
    return f"{_adapter_path(adapter)}/aliases/{name(alias, 'alias')}"


def get_alias(adapter: str, alias: str) -> Call[dict[str, Any]]:
    return Call("GET", _alias_path(adapter, alias), _json)


def set_alias(adapter: str, alias: str, version: int) -> Call[dict[str, Any]]:
    path = _alias_path(adapter, alias)
    return Call("PUT", path, _json, json={"version": version})


def unquarantine_adapter(name: str, version: int, tenant: str | None) -> Call[AdapterVersion]:
    params = {"tenant": tenant} if tenant else None
    path = f"{_adapter_path(name, version)}/unquarantine"
    return Call("POST", path, _one(AdapterVersion), params=params)


def delete_adapter_version(name: str, version: int) -> Call[None]:
    return Call("DELETE", _adapter_path(name, version), _nothing)


def export_adapter(name: str, version: int) -> Call[ExportResult]:
    # A trainer merges base + adapter: minutes for a big model, not seconds.
    path = f"{_adapter_path(name, version)}/export"
    return Call("POST", path, _one(ExportResult), timeout=600.0)


def export_download_path(name: str, version: int) -> str:
    """A tar of the merged model made by ``export_adapter``; streamed, no ``Call``."""
    return _adapter_path(name, version) + "/export/download"


def download_path(name: str, version: int) -> str:
    """A tar of the version's PEFT files; streamed, so there is no ``Call`` for it."""
    return _adapter_path(name, version) + "/download"


# --- workers ------------------------------------------------------------------------------


def workers() -> Call[list[WorkerInfo]]:
    return Call("GET", "/v1/workers", _many(WorkerInfo))


def cordon_worker(worker_id: str, reason: str = "") -> Call[WorkerOps]:
    path = f"/v1/workers/{worker_id}/cordon"
    return Call("POST", path, _one(WorkerOps), json={"reason": reason})


def uncordon_worker(worker_id: str) -> Call[WorkerOps]:
    return Call("POST", f"/v1/workers/{worker_id}/uncordon", _one(WorkerOps))


def clear_worker(worker_id: str) -> Call[WorkerOps]:
    return Call("POST", f"/v1/workers/{worker_id}/clear", _one(WorkerOps))


def drain_worker(worker_id: str, move_jobs: bool = False, reason: str = "") -> Call[WorkerOps]:
    body = {"move_jobs": move_jobs, "reason": reason}
    return Call("POST", f"/v1/workers/{worker_id}/drain", _one(WorkerOps), json=body)


def benchmark_worker(worker_id: str) -> Call[WorkerBenchmark]:
    # The gateway waits up to 180 s for the worker (a GPU worker measures in a child process).
    path = f"/v1/workers/{worker_id}/benchmark"
    return Call("POST", path, _one(WorkerBenchmark), timeout=200.0)


def inference_workers() -> Call[list[InferenceHeartbeat]]:
    return Call("GET", "/v1/inference/workers", _many(InferenceHeartbeat))

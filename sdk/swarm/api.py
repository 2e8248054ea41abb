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

from swarm_common.datasets import DatasetInfo
from swarm_common.jobs import JobRecord, JobSpec
from swarm_common.metrics import JobMetrics
from swarm_common.registry import AdapterVersion, ExportResult, ModelVersion
from swarm_common.workers import WorkerInfo

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


# --- jobs ---------------------------------------------------------------------------------


def submit(spec: dict[str, Any] | JobSpec, idempotency_key: str | None) -> Call[JobRecord]:
    body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/jobs", _one(JobRecord), json=body, headers=headers)


def get_job(job_id: str) -> Call[JobRecord]:
    return Call("GET", f"/v1/jobs/{job_id}", _one(JobRecord))


def _job_page(resp: httpx.Response) -> tuple[list[JobRecord], str | None]:
    body = resp.json()
    return [JobRecord.model_validate(j) for j in body["data"]], body.get("next_cursor")


def list_jobs(
    state: str | None, name: str | None, limit: int, cursor: str | None, tenant: str | None = None
) -> Call[tuple[list[JobRecord], str | None]]:
    params = _params(state=state, name=name, limit=limit, cursor=cursor, tenant=tenant)
    return Call("GET", "/v1/jobs", _job_page, params=params)


def cancel(job_id: str, reason: str | None) -> Call[JobRecord]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _one(JobRecord), params=_params(reason=reason))


def metrics(job_id: str, max_points: int | None) -> Call[JobMetrics]:
    params = _params(max_points=max_points)
    return Call("GET", f"/v1/jobs/{job_id}/metrics", _one(JobMetrics), params=params)


# --- datasets -----------------------------------------------------------------------------


def list_datasets() -> Call[list[DatasetInfo]]:
    return Call("GET", "/v1/datasets", _many(DatasetInfo))


def get_dataset(dataset_id: str) -> Call[DatasetInfo]:
    return Call("GET", f"/v1/datasets/{dataset_id}", _one(DatasetInfo))


def dataset_stats(dataset_id: str, model: str | None) -> Call[dict[str, Any]]:
    params = _params(model=model)
    return Call("GET", f"/v1/datasets/{dataset_id}/stats", _json, params=params, timeout=300.0)


UPLOAD_DATASET = Call("POST", "/v1/datasets", _one(DatasetInfo), timeout=300.0)
ADD_MODEL = Call("POST", "/v1/models", _one(ModelVersion), timeout=600.0)


# --- models -------------------------------------------------------------------------------


def list_models() -> Call[list[ModelVersion]]:
    return Call("GET", "/v1/models", _many(ModelVersion))


# --- adapters -----------------------------------------------------------------------------


def _adapter_path(name: str, version: int | None = None) -> str:
    return f"/v1/adapters/{name}" + (f"/versions/{version}" if version is not None else "")


def list_adapters(name: str | None) -> Call[list[AdapterVersion]]:
    return Call("GET", "/v1/adapters", _many(AdapterVersion), params=_params(name=name))


def get_adapter(name: str, version: int | None) -> Call[AdapterVersion]:
    return Call("GET", _adapter_path(name, version), _one(AdapterVersion))


def adapter_lineage(name: str, version: int) -> Call[dict[str, Any]]:
    return Call("GET", _adapter_path(name, version) + "/lineage", _json)


def get_alias(name: str, alias: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/adapters/{name}/aliases/{alias}", _json)


def set_alias(name: str, alias: str, version: int) -> Call[dict[str, Any]]:
    path = f"/v1/adapters/{name}/aliases/{alias}"
    return Call("PUT", path, _json, json={"version": version})


def delete_adapter_version(name: str, version: int) -> Call[None]:
    return Call("DELETE", _adapter_path(name, version), _nothing)


def export_adapter(name: str, version: int) -> Call[ExportResult]:
    # A trainer merges base + adapter: minutes for a big model, not seconds.
    path = f"{_adapter_path(name, version)}/export"
    return Call("POST", path, _one(ExportResult), timeout=600.0)


def download_path(name: str, version: int) -> str:
    """A tar of the version's PEFT files; streamed, so there is no ``Call`` for it."""
    return _adapter_path(name, version) + "/download"


# --- workers ------------------------------------------------------------------------------


def workers() -> Call[list[WorkerInfo]]:
    return Call("GET", "/v1/workers", _many(WorkerInfo))

"""The OpenAPI document as a contract: every status each operation can answer, declared with
its error body, so that nothing undocumented comes back; and OpenAPI links between operations
(a submitted job -> get, cancel, pause, resume, events, metrics; a job -> its adapter's
download; an OpenAI file -> a fine-tuning job on it -> its events and checkpoints), which
clients and stateful fuzzers (schemathesis) follow.

The statuses come from a few sources, shared by whole routers: auth (401), validation and the
up-front checks (422), NATS or a service away (503, ``swarm_gateway.state``), and the services'
refusals mapped in ``swarm_gateway.errors`` (403, 404, 409, 422, 502).

The request schemas are the validation (pydantic constraints, one source for both): a request
the document allows is refused only for a rule JSON Schema cannot state (one field against
another, an uploaded file's content, a cursor this API did not issue). Those rules are listed
on the operation's 422 (``x-business-rules``), so that a client, and the conformance check
that schema-valid data is accepted, can tell a business refusal from a loose schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class FieldError(BaseModel):
    loc: list[str | int] = Field(description="where: body/query/path/header, then the field")
    msg: str
    type: str


class ErrorBody(BaseModel):
    """``{"detail": "why"}``, or the list of bad fields (422)."""

    detail: str | list[FieldError]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """OpenAI's error shape, on the OpenAI-compatible routes."""

    error: OpenAIErrorDetail


_WHY = {
    400: "a field the OpenAI-compatible API does not support, or a bad value",
    401: "missing or unknown API key",
    403: "needs an admin key, or the service refused the caller",
    404: "not found (another tenant's is indistinguishable from a missing one)",
    409: "conflicts with the current state (an alias holds the version, a concurrent change)",
    413: "upload larger than SWARM_MAX_UPLOAD_BYTES",
    422: "a field is invalid; `detail` names it",
    429: "the inference workers are overloaded; retry later",
    502: "a service behind the gateway failed, or stored files do not match their sha256",
    503: "NATS or the service that answers this is not reachable; `detail` says which and why",
}

# What every /v1 route can answer, and what each router adds.
COMMON = (401, 422, 503)
REFUSALS = (403, 404, 409, 502)
ROUTER_STATUSES: dict[str, tuple[int, ...]] = {
    "jobs": (*COMMON, *REFUSALS),
    "sweeps": (*COMMON, *REFUSALS),
    "datasets": (*COMMON, *REFUSALS, 413),
    "models": (*COMMON, *REFUSALS, 413),
    "adapters": (*COMMON, *REFUSALS),
    "workers": (*COMMON, 403),
    "inference": (400, 401, 403, 404, 409, 429, 502, 503),
    # Files and fine-tuning jobs: a bad value is OpenAI's 400, not a 422.
    "openai": (400, 401, 403, 404, 409, 413, 502, 503),
    # The Tinker training API (routes.tinker): FastAPI's error shape, which the SDK reads.
    "tinker": (*COMMON, *REFUSALS, 400),
    # The dashboard's view of the Tinker sessions (routes.tinker_overview): reads only.
    "tinker_overview": COMMON,
}
OPENAI_ROUTERS = ("inference", "openai")


def responses(router: str) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` to declare for every operation of ``router``."""
    model = OpenAIErrorBody if router in OPENAI_ROUTERS else ErrorBody
    return {code: {"model": model, "description": _WHY[code]} for code in ROUTER_STATUSES[router]}


# (path, method, status) -> links: name -> (target path, target method, parameters).
_LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, dict[str, Any]]]] = {}


def _job_links(source: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    job = {"job_id": f"$response.body#/{source}"}
    return {
        "GetJob": ("/v1/jobs/{job_id}", "get", job),
        "CancelJob": ("/v1/jobs/{job_id}/cancel", "post", job),
        "PauseJob": ("/v1/jobs/{job_id}/pause", "post", job),
        "ResumeJob": ("/v1/jobs/{job_id}/resume", "post", job),
        "JobEvents": ("/v1/jobs/{job_id}/events", "get", job),
        "JobMetrics": ("/v1/jobs/{job_id}/metrics", "get", job),
    }


for _status in ("200", "201", "202"):
    _LINKS[("/v1/jobs", "post", _status)] = _job_links("job_id")
_LINKS[("/v1/jobs/{job_id}", "get", "200")] = {
    **_job_links("job_id"),
    "DownloadAdapter": (
        "/v1/adapters/{name}/versions/{version}/download",
        "get",
        {"name": "$response.body#/adapter/name", "version": "$response.body#/adapter/version"},
    ),
}
_LINKS[("/v1/jobs/{job_id}/cancel", "post", "202")] = {
    "GetJob": ("/v1/jobs/{job_id}", "get", {"job_id": "$response.body#/job_id"}),
    "JobEvents": ("/v1/jobs/{job_id}/events", "get", {"job_id": "$response.body#/job_id"}),
}
for _status in ("200", "201"):
    _LINKS[("/v1/datasets", "post", _status)] = {
        "GetDataset": ("/v1/datasets/{dataset_id}", "get", {"dataset_id": "$response.body#/id"}),
        "DatasetStats": (
            "/v1/datasets/{dataset_id}/stats",
            "get",
            {"dataset_id": "$response.body#/id"},
        ),
    }
_ADAPTER = {"name": "$response.body#/name", "version": "$response.body#/version"}
_LINKS[("/v1/adapters/{name}", "get", "200")] = {
    "GetAdapterVersion": ("/v1/adapters/{name}/versions/{version}", "get", _ADAPTER),
    "AdapterLineage": ("/v1/adapters/{name}/versions/{version}/lineage", "get", _ADAPTER),
    "DownloadAdapter": ("/v1/adapters/{name}/versions/{version}/download", "get", _ADAPTER),
}


_SPEC_RULES = (
    "`base_model`, `dataset`, `validation` and `from_adapter` must name what the registry "
    "holds for the caller (an adapter trained on that base model); `from_adapter` and "
    "`from_checkpoint` exclude each other, and `from_checkpoint_optimizer` needs "
    "`from_checkpoint`, whose checkpoint must be of that base model; `lora.target_modules` "
    "must name modules of the base model; a sweep range's `low` must be below its `high` "
    "(`low` >= 1 and `step` 1 for a log int range); a sweep's `base.name`, if given, equals "
    "its `name`; a searched field must be one the trial template has"
)
# (path, method) -> what is refused with 422 although the schema allows it.
BUSINESS_RULES: dict[tuple[str, str], str] = {
    ("/v1/jobs", "get"): "`cursor` is not a `next_cursor` this API returned",
    ("/v1/jobs", "post"): _SPEC_RULES,
    ("/v1/jobs/estimate", "post"): _SPEC_RULES,
    ("/v1/sweeps", "post"): _SPEC_RULES,
    ("/v1/datasets", "post"): (
        "the file must be JSON Lines of at least one example, each {'text'}, "
        "{'prompt','completion'} or {'messages':[{'role','content'}]}"
    ),
    ("/v1/models", "post"): (
        "the files need unique, plain names, one `config.json` and at least one "
        "`*.safetensors` weights file"
    ),
}

# Every operation that answers 401 takes an API key as a bearer token.
SECURITY_SCHEME = "apiKey"


def add_security(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the API-key scheme, applied to every operation that can answer 401."""
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key from SWARM_API_KEYS (admin routes: SWARM_ADMIN_KEYS); "
        "`Authorization: Bearer <key>`",
    }
    for item in document["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict) and "401" in operation.get("responses", {}):
                operation["security"] = [{SECURITY_SCHEME: []}]
    return document


# OpenAI's routes answer a request they refuse with 400 (OpenAI's convention), for what the
# schema cannot say: the model must be one the caller may use, a file must be theirs and
# valid training data, hyperparameters must fit the data, and a method must be one Swarm has.
OPENAI_RULES: dict[tuple[str, str], str] = {
    ("/v1/fine_tuning/jobs", "post"): (
        "`model` must be a base model or one of the caller's adapters, `training_file` and "
        "`validation_file` the caller's valid files, `suffix` a valid adapter name, "
        "hyperparameters within what the data allows, `method.type` supervised"
    ),
    ("/v1/files", "post"): "the file must be valid JSON Lines training data, purpose fine-tune",
    ("/v1/chat/completions", "post"): (
        "`model` must be one the caller may use; `response_format` one that is honoured; "
        "`top_logprobs` only with `logprobs` true"
    ),
    ("/v1/completions", "post"): (
        "`model` must be one the caller may use; `response_format` one that is honoured"
    ),
}


def add_business_rules(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with each rule above on its operation's 422 (OpenAI's routes: 400)."""
    for rules, status in ((BUSINESS_RULES, 422), (OPENAI_RULES, 400)):
        for (path, method), rule in rules.items():
            operation = document["paths"].get(path, {}).get(method, {})
            response = operation.get("responses", {}).get(str(status))
            if response is None:
                continue
            response["description"] = f"{_WHY.get(status, 'refused')}; or a business rule: {rule}"
            response["x-business-rules"] = [rule]
    return document


# OpenAI's files and fine-tuning jobs: an upload -> the file, its content, a job on it; a job
# -> itself, its events, checkpoints, cancel, and the files it names.
_FILE = {"file_id": "$response.body#/id"}
_LINKS[("/v1/files", "post", "200")] = {
    "RetrieveFile": ("/v1/files/{file_id}", "get", _FILE),
    "FileContent": ("/v1/files/{file_id}/content", "get", _FILE),
    "DeleteFile": ("/v1/files/{file_id}", "delete", _FILE),
}


def _fine_tuning_links(source: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    job = {"fine_tuning_job_id": f"$response.body#/{source}"}
    base = "/v1/fine_tuning/jobs/{fine_tuning_job_id}"
    return {
        "RetrieveFineTuningJob": (base, "get", job),
        "CancelFineTuningJob": (f"{base}/cancel", "post", job),
        "PauseFineTuningJob": (f"{base}/pause", "post", job),
        "ResumeFineTuningJob": (f"{base}/resume", "post", job),
        "FineTuningJobEvents": (f"{base}/events", "get", job),
        "FineTuningJobCheckpoints": (f"{base}/checkpoints", "get", job),
        "TrainingFile": (
            "/v1/files/{file_id}",
            "get",
            {"file_id": "$response.body#/training_file"},
        ),
    }


_LINKS[("/v1/fine_tuning/jobs", "post", "200")] = _fine_tuning_links("id")
_LINKS[("/v1/fine_tuning/jobs/{fine_tuning_job_id}", "get", "200")] = _fine_tuning_links("id")
_LINKS[("/v1/fine_tuning/jobs/{fine_tuning_job_id}/cancel", "post", "200")] = _fine_tuning_links(
    "id"
)


def add_links(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the links above, by the target operations' ``operationId``."""
    paths = document["paths"]
    for (path, method, status), links in _LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        response["links"] = {
            name: {
                "operationId": paths[target][target_method]["operationId"],
                "parameters": parameters,
            }
            for name, (target, target_method, parameters) in links.items()
            if target in paths and target_method in paths[target]
        }
    return document

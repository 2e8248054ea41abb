"""The OpenAPI document says what the validation accepts: each request below was allowed by
the document and refused by the gateway (or the other way round). Now the schema refuses it
too, or the operation's 422 lists the business rule that refuses it; the API-key scheme is
declared; OPTIONS on a concrete path lists only the methods it serves."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

from swarm_gateway import create_app
from swarm_runtime.settings import Settings

DOCUMENT = create_app(Settings()).openapi()


def _valid(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` is valid against ``schema``, a part of the document ($refs resolved
    against the whole document)."""
    root = {**schema, "components": DOCUMENT["components"]}
    return jsonschema.Draft202012Validator(root).is_valid(value)


def _operation(path: str, method: str) -> dict[str, Any]:
    operation: dict[str, Any] = DOCUMENT["paths"][path][method]
    return operation


def _body_schema(path: str, method: str, media: str = "application/json") -> dict[str, Any]:
    schema: dict[str, Any] = _operation(path, method)["requestBody"]["content"][media]["schema"]
    return schema


def _parameter_schema(path: str, method: str, name: str) -> dict[str, Any]:
    for parameter in _operation(path, method)["parameters"]:
        if parameter["name"].lower() == name.lower():
            schema: dict[str, Any] = parameter["schema"]
            return schema
    raise AssertionError(f"{method} {path} has no parameter {name}")


def _business_rules(path: str, method: str) -> str:
    return " ".join(_operation(path, method)["responses"]["422"].get("x-business-rules", []))


JOB = {"name": "bot", "base_model": "mini", "dataset": "ds-0123456789abcdef"}


def test_an_empty_target_modules_list_is_outside_the_job_schema() -> None:
    schema = _body_schema("/v1/jobs", "post")
    assert _valid(schema, JOB)
    assert _valid(schema, {**JOB, "lora": {"target_modules": "all-linear"}})
    assert not _valid(schema, {**JOB, "lora": {"target_modules": []}})
    assert not _valid(schema, {**JOB, "lora": {"target_modules": [""]}})


def test_chat_roles_and_best_of_are_what_the_openai_routes_serve() -> None:
    chat = _body_schema("/v1/chat/completions", "post")
    assert _valid(chat, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert not _valid(chat, {"model": "m", "messages": [{"role": "", "content": "hi"}]})
    assert not _valid(chat, {"model": "m", "messages": [{"role": "tool", "content": "hi"}]})
    completion = _body_schema("/v1/completions", "post")
    assert _valid(completion, {"model": "m", "prompt": "hi", "best_of": 1})
    assert not _valid(completion, {"model": "m", "prompt": "hi", "best_of": 2})


@pytest.mark.parametrize("path", ["/v1/jobs/{job_id}/events", "/v1/sweeps/{sweep_id}/events"])
def test_last_event_id_is_a_stream_sequence_in_the_document(path: str) -> None:
    schema = _parameter_schema(path, "get", "last-event-id")
    assert _valid(schema, "42")
    for refused in ("null", None, "-1", "abc"):
        assert not _valid(schema, refused), refused


async def test_a_cursor_is_refused_by_the_schema_or_by_a_documented_rule(
    client: httpx.AsyncClient,
) -> None:
    schema = _parameter_schema("/v1/jobs", "get", "cursor")
    assert not _valid(schema, None)
    assert not _valid(schema, "not a cursor!")
    # Within the pattern, a cursor this API never issued is a documented business refusal.
    assert _valid(schema, "bWFkZS11cA")
    assert "cursor" in _business_rules("/v1/jobs", "get")
    resp = await client.get("/v1/jobs", params={"cursor": "bWFkZS11cA"})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["query", "cursor"]


async def test_a_dataset_without_examples_is_a_documented_refusal(
    client: httpx.AsyncClient,
) -> None:
    assert "at least one example" in _business_rules("/v1/datasets", "post")
    resp = await client.post("/v1/datasets", files={"file": ("d.jsonl", b"")})
    assert resp.status_code == 422, resp.text


def test_a_model_needs_its_files_in_the_document() -> None:
    body = _body_schema("/v1/models", "post", "multipart/form-data")
    assert not _valid(body, {"name": "mini", "files": []})
    assert _valid(body, {"name": "mini", "files": ["config.json", "model.safetensors"]})
    # Which files: a documented rule, so that the refusal can name the missing one.
    assert "config.json" in _business_rules("/v1/models", "post")


async def test_a_sweep_range_upside_down_is_a_documented_refusal(
    client: httpx.AsyncClient,
) -> None:
    sweep = {
        "name": "sw",
        "base": {"base_model": "mini", "dataset": "ds-0123456789abcdef"},
        "budget": 2,
        "search": {"training.lr": {"type": "uniform", "low": 0.1, "high": 0.01}},
    }
    assert _valid(_body_schema("/v1/sweeps", "post"), sweep)
    assert "`low` must be below its `high`" in _business_rules("/v1/sweeps", "post")
    resp = await client.post("/v1/sweeps", json=sweep)
    assert resp.status_code == 422, resp.text


async def test_drain_takes_only_a_boolean(client: httpx.AsyncClient) -> None:
    schema = _body_schema("/v1/workers/{worker_id}/drain", "post")
    assert not _valid(schema, {"move_jobs": 0})
    for loose in (0, 1, "true", "yes"):
        resp = await client.post("/v1/workers/w-1/drain", json={"move_jobs": loose})
        assert resp.status_code == 422, (loose, resp.status_code, resp.text)
        assert resp.json()["detail"][0]["loc"] == ["body", "move_jobs"]


def test_the_api_key_scheme_is_declared_where_a_key_is_needed() -> None:
    schemes = DOCUMENT["components"]["securitySchemes"]
    assert schemes["apiKey"] == {**schemes["apiKey"], "type": "http", "scheme": "bearer"}
    assert _operation("/v1/jobs", "post")["security"] == [{"apiKey": []}]
    assert "security" not in _operation("/healthz", "get")
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if "401" in operation["responses"]:
                assert operation.get("security") == [{"apiKey": []}], (method, path)


async def test_options_of_a_concrete_path_lists_only_its_methods(
    client: httpx.AsyncClient,
) -> None:
    resp = await client.options("/v1/jobs/estimate")
    assert resp.status_code == 204
    assert set(resp.headers["allow"].split(", ")) == {"POST", "OPTIONS"}
    got = await client.get("/v1/jobs/estimate")
    assert got.status_code == 405
    assert set(got.headers["allow"].split(", ")) == {"POST", "OPTIONS"}
    # A templated path beside it is unchanged.
    job = await client.options("/v1/jobs/job-1")
    assert set(job.headers["allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}

"""A job naming a base model the registry does not know, or a LoRA target module the model
does not have, is refused at submission (422 naming the field), not failed later."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from swarm_runtime.settings import Settings

from ..registry.conftest import safetensors_bytes
from .conftest import make_app

WEIGHTS = {
    "model.embed_tokens.weight": [8, 4],
    "model.layers.0.self_attn.q_proj.weight": [4, 4],
    "model.layers.0.self_attn.v_proj.weight": [4, 4],
    "model.layers.0.mlp.up_proj.weight": [8, 4],
    "model.layers.0.input_layernorm.weight": [4],  # 1-D: no LoRA target
    "model.layers.0.mlp.up_proj.bias": [8],
}
DATA = "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)).encode()


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """The real registry in-process, a gateway with a registered model and a dataset."""
    from swarm_registry.app import build_app as build_registry

    app = make_app(settings)
    async with (
        build_registry(settings),
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        files = [
            ("files", ("config.json", json.dumps({"model_type": "llama"}).encode())),
            ("files", ("model.safetensors", safetensors_bytes(WEIGHTS))),
        ]
        model = await c.post("/v1/models", data={"name": "mini"}, files=files)
        assert model.status_code == 201, model.text
        assert model.json()["modules"] == ["embed_tokens", "q_proj", "up_proj", "v_proj"]
        dataset = await c.post("/v1/datasets", files={"file": ("d.jsonl", DATA)})
        yield c, dataset.json()["id"]


def job(dataset: str, base_model: str = "mini", targets: object = None) -> dict[str, object]:
    spec: dict[str, object] = {"name": "bot", "base_model": base_model, "dataset": dataset}
    if targets is not None:
        spec["lora"] = {"target_modules": targets}
    return spec


async def test_an_unknown_base_model_is_a_422(stack: tuple[httpx.AsyncClient, str]) -> None:
    client, dataset = stack
    for ref in ("nope", "mini@9"):
        resp = await client.post("/v1/jobs", json=job(dataset, ref))
        assert resp.status_code == 422, resp.text
        (error,) = resp.json()["detail"]
        assert error["loc"] == ["body", "base_model"]
        assert ref in error["msg"]


async def test_an_unknown_target_module_is_a_422_naming_the_entry(
    stack: tuple[httpx.AsyncClient, str],
) -> None:
    client, dataset = stack
    resp = await client.post("/v1/jobs", json=job(dataset, targets=["q_proj", "qkv_proj"]))
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == ["body", "lora", "target_modules", 1]
    assert "qkv_proj" in error["msg"]
    assert "q_proj, up_proj, v_proj" in error["msg"]
    norm = await client.post("/v1/jobs", json=job(dataset, targets=["input_layernorm"]))
    assert norm.status_code == 422


@pytest.mark.parametrize(
    "targets", [["q_proj", "v_proj"], ["self_attn.q_proj", "up_proj"], "all-linear"]
)
async def test_known_modules_are_accepted(
    stack: tuple[httpx.AsyncClient, str], targets: object
) -> None:
    client, dataset = stack
    resp = await client.post("/v1/jobs", json=job(dataset, targets=targets))
    # No scheduler here: accepted, waiting to be recorded (202).
    assert resp.status_code == 202, resp.text


async def test_task_evals_with_nothing_to_grade_are_a_422_naming_the_field(
    stack: tuple[httpx.AsyncClient, str],
) -> None:
    client, text_dataset = stack
    graders = [{"type": "exact_match"}]
    # Plain text rows have no answers to grade.
    resp = await client.post(
        "/v1/jobs", json=job(text_dataset) | {"evals": {"fraction": 0.5, "graders": graders}}
    )
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "evals", "fraction"]
    assert "plain text rows" in resp.json()["detail"][0]["msg"]
    # An eval set that is not there.
    missing = "ds-" + "f" * 24
    resp = await client.post(
        "/v1/jobs", json=job(text_dataset) | {"evals": {"dataset": missing, "graders": graders}}
    )
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "evals", "dataset"]
    # No validation set and nothing held out: no rows at all.
    rows = "".join(json.dumps({"prompt": f"q{i}", "completion": "a"}) + "\n" for i in range(4))
    pc = await client.post("/v1/datasets", files={"file": ("pc.jsonl", rows.encode())})
    spec = job(pc.json()["id"]) | {
        "training": {"val_fraction": 0.0},
        "evals": {"graders": graders},
    }
    resp = await client.post("/v1/jobs", json=spec)
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "training", "val_fraction"]
    assert "would have no rows" in resp.json()["detail"][0]["msg"]

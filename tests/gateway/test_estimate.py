"""POST /v1/jobs/estimate: a job spec in, its GPU memory estimate out; the registry is played
by the test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import nats
import pytest

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.memory import ModelShape
from swarm_contracts.registry import AdapterVersion, GetModel, Lineage, ModelVersion
from swarm_contracts.replies import Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings

SHAPE = ModelShape(
    hidden_size=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    intermediate_size=8192,
    vocab_size=128256,
    parameter_count=1_235_814_400,
    dtype="bfloat16",
)


def version(name: str, shape: ModelShape | None) -> ModelVersion:
    return ModelVersion(
        name=name,
        version=3,
        store_key=f"models/{name}/x",
        files={},
        digest="d",
        architecture="LlamaForCausalLM",
        parameter_count=SHAPE.parameter_count,
        tokenizer=True,
        shape=shape,
    )


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[list[GetModel]]:
    """Knows ``llama`` (with a shape) and ``odd`` (without one); nothing else."""
    nc = await nats.connect(settings.nats_url)
    asked: list[GetModel] = []

    async def models_get(msg: nats.aio.msg.Msg) -> None:
        request = GetModel.model_validate_json(msg.data)
        asked.append(request)
        known = {"llama": version("llama", SHAPE), "odd": version("odd", None)}
        reply: Reply[ModelVersion]
        if request.name in known:
            reply = Reply[ModelVersion](ok=True, result=known[request.name])
        else:
            reply = Reply(ok=False, code="not_found", error=f"unknown model {request.name!r}")
        await msg.respond(reply.model_dump_json().encode())

    async def adapters_get(msg: nats.aio.msg.Msg) -> None:
        # ``bot@1``: an r=4 q/v adapter trained on llama@3.
        lineage = Lineage(
            tenant="default",
            job_id="job-0000000001",
            attempt=1,
            base_model="llama",
            base_model_version=3,
            base_model_digest="d",
            dataset="ds-" + "0" * 16,
            dataset_digest="d",
            lora=LoraSpec(r=4, target_modules=["q_proj", "v_proj"]),
            training=TrainingSpec(),
        )
        found = AdapterVersion(
            name="bot", version=1, tenant="default", store_key="a", files={}, lineage=lineage
        )
        await msg.respond(Reply[AdapterVersion](ok=True, result=found).model_dump_json().encode())

    subjects = Subjects(settings.namespace)
    await nc.subscribe(subjects.registry("models.get"), cb=models_get)
    await nc.subscribe(subjects.registry("adapters.get"), cb=adapters_get)
    yield asked
    await nc.close()


def spec(**extra: object) -> dict:
    body: dict = {
        "name": "bot",
        "base_model": "llama@3",
        "dataset": "ds-" + "0" * 16,
        "lora": {"r": 16, "target_modules": "all-linear"},
        "training": {"batch_size": 4, "seq_len": 1024},
        "resources": {"gpus_per_worker": 1},
    }
    return body | extra


async def test_estimate_of_a_spec(client: httpx.AsyncClient, registry: list[GetModel]) -> None:
    resp = await client.post("/v1/jobs/estimate", json=spec())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert registry[-1] == GetModel(name="llama", version=3)
    assert body["base_model"] == "llama@3"
    assert body["tokens"] == 4 * 1024
    assert body["weights_bytes"] == 2 * SHAPE.parameter_count
    assert body["lora_parameters"] == 11_272_192
    terms = ("weights", "lora", "activations", "logits", "runtime")
    assert body["total_bytes"] == sum(body[f"{t}_bytes"] for t in terms)

    checkpointed = await client.post(
        "/v1/jobs/estimate",
        json=spec(training={"batch_size": 4, "seq_len": 1024, "gradient_checkpointing": True}),
    )
    assert checkpointed.json()["activations_bytes"] < body["activations_bytes"]
    qlora = await client.post("/v1/jobs/estimate", json=spec(lora={"r": 16, "quantize": "nf4"}))
    assert qlora.json()["weights_bytes"] < body["weights_bytes"]


async def test_continuing_an_adapter_is_estimated_with_the_parents_lora(
    client: httpx.AsyncClient, registry: list[GetModel]
) -> None:
    resp = await client.post("/v1/jobs/estimate", json=spec(from_adapter="bot@1"))
    assert resp.status_code == 200, resp.text
    # The parent's r=4 on q and v, not the spec's r=16 on every linear module.
    assert resp.json()["lora_parameters"] == 16 * 4 * ((2048 + 2048) + (2048 + 512))


async def test_unknown_model_is_404_and_a_model_without_shape_422(
    client: httpx.AsyncClient, registry: list[GetModel]
) -> None:
    resp = await client.post("/v1/jobs/estimate", json=spec(base_model="nope"))
    assert resp.status_code == 404, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "base_model"]
    resp = await client.post("/v1/jobs/estimate", json=spec(base_model="odd"))
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "base_model"]
    assert "architecture" in resp.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"lora": {"quantize": "int3"}}, ["body", "lora", "quantize"]),
        ({"training": {"seq_len": 0}}, ["body", "training", "seq_len"]),
        ({"batch": 3}, ["body", "batch"]),
    ],
)
async def test_bad_spec_is_422_naming_the_field(
    client: httpx.AsyncClient, patch: dict, loc: list[str]
) -> None:
    resp = await client.post("/v1/jobs/estimate", json=spec(**patch))
    assert resp.status_code == 422, resp.text
    assert loc in [e["loc"] for e in resp.json()["detail"]]

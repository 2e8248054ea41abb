"""`swarm jobs estimate job.yaml` against a real gateway; the registry is played by the test."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from swarm_contracts.memory import ModelShape
from swarm_contracts.registry import GetModel, ModelVersion
from swarm_contracts.replies import Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings

from ..conftest import ServerThread

runner = CliRunner()
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


def cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", url, *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def test_jobs_estimate_prints_each_term(
    gateway: ServerThread, settings: Settings, tmp_path: Path
) -> None:
    nc = await nats.connect(settings.nats_url)

    async def models_get(msg: nats.aio.msg.Msg) -> None:
        request = GetModel.model_validate_json(msg.data)
        reply: Reply[ModelVersion] = Reply(ok=False, code="not_found", error="unknown model")
        if request.name == "llama":
            found = ModelVersion(
                name="llama",
                version=1,
                store_key="models/llama/x",
                files={},
                digest="d",
                architecture="LlamaForCausalLM",
                parameter_count=SHAPE.parameter_count,
                tokenizer=True,
                shape=SHAPE,
            )
            reply = Reply(ok=True, result=found)
        await msg.respond(reply.model_dump_json().encode())

    await nc.subscribe(Subjects(settings.namespace).registry("models.get"), cb=models_get)
    spec = {
        "name": "bot",
        "base_model": "llama",
        "dataset": "ds-" + "0" * 16,
        "lora": {"r": 16, "target_modules": "all-linear"},
        "training": {"batch_size": 2, "seq_len": 1024},
        "resources": {"gpus_per_worker": 1},
    }
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    try:
        # The CLI blocks; the registry's answers need this loop free.
        code, out = await asyncio.to_thread(cli, gateway.url, "jobs", "estimate", str(job))
        assert code == 0, out
        assert "llama@1" in out
        assert "2,048 tokens" in out
        assert "weights" in out
        assert "2.30 GiB" in out
        assert "11,272,192 params" in out
        assert "total per GPU" in out

        code, out = await asyncio.to_thread(
            cli, gateway.url, "jobs", "estimate", str(job), "--json"
        )
        assert code == 0, out
        body = json.loads(out)
        assert body["tokens"] == 2048
        assert body["weights_bytes"] == 2 * SHAPE.parameter_count

        # A CPU-only job: host memory of a worker, in fp32, with no CUDA runtime.
        job.write_text(yaml.safe_dump({**spec, "resources": {"gpus_per_worker": 0}}))
        code, out = await asyncio.to_thread(cli, gateway.url, "jobs", "estimate", str(job))
        assert code == 0, out
        assert "host memory per CPU worker" in out, out
        assert "total per worker" in out, out
        assert "GPU" not in out, out
        assert "CUDA" not in out, out
        code, out = await asyncio.to_thread(
            cli, gateway.url, "jobs", "estimate", str(job), "--json"
        )
        cpu = json.loads(out)
        assert (cpu["device"], cpu["runtime_bytes"]) == ("cpu", 0)
        assert cpu["activations_bytes"] > body["activations_bytes"]  # fp32, not bf16

        job.write_text(yaml.safe_dump({**spec, "base_model": "nope"}))
        code, out = await asyncio.to_thread(cli, gateway.url, "jobs", "estimate", str(job))
        assert code == 2
        assert "base_model" in out
    finally:
        await nc.close()

"""A registered adapter is a standard artifact: its ``adapter_config.json`` names a base model
anyone can resolve, and ``swarm adapters pull NAME --with-base`` gives a directory that stock
``AutoPeftModelForCausalLM`` and ``peft`` load unchanged."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import nats
import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from swarm.aio import AsyncClient
from swarm.cli import app as cli
from swarm.client import Client
from swarm_contracts.jobs import LoraSpec, ModelRef, TrainingSpec
from swarm_contracts.layout import output_adapter
from swarm_contracts.registry import AdapterVersion, Lineage, RegisterAdapter, Reply
from swarm_contracts.subjects import Subjects
from swarm_gateway import create_app
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_trainer.checkpoint import save_adapter
from swarm_trainer.model import build_model

from ..conftest import ServerThread

# Never fetched: the pulled directory points at its local copy instead.
HUB_ID = "swarm-test/tiny-llama"


def trained_looking(model_dir: Path) -> PeftModel:
    torch.manual_seed(0)
    model = build_model(model_dir, LoraSpec(target_modules=["q_proj", "v_proj"]), TrainingSpec())
    with torch.no_grad():  # LoRA B starts at zero, which would make the adapter a no-op
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def test_the_base_model_reference_is_the_hub_id_else_name_at_version() -> None:
    ref = ModelRef(name="smol", version=2, store_key="models/smol/x", digest="d")
    assert ref.reference == "smol@2"
    hub = ref.model_copy(update={"hf_id": "HuggingFaceTB/SmolLM2-135M"})
    assert hub.reference == "HuggingFaceTB/SmolLM2-135M"


def test_a_saved_adapter_names_its_base_model_not_a_worker_path(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    save_adapter(trained_looking(tiny_model_dir), tmp_path / "a", "tiny@3")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny@3"
    assert str(tiny_model_dir) not in (tmp_path / "a" / "adapter_config.json").read_text()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


async def test_pull_with_base_loads_with_stock_auto_peft(
    settings: Settings, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swarm_registry.app import build_app as build_registry

    async with build_registry(settings):
        with ServerThread(create_app(settings)) as gw:
            client = Client(gw.url)
            # The registry answers on this event loop: the sync client and CLI run in threads.
            model = await asyncio.to_thread(client.add_model, "tiny", tiny_model_dir, HUB_ID)
            assert model.hf_id == HUB_ID
            # The adapter as the trainer's finish() writes it, registered as the trainer does.
            adapter_dir = tmp_path / "trained"
            save_adapter(trained_looking(tiny_model_dir), adapter_dir, model.reference)
            key = output_adapter("job-0123456789abcdef0123", 1)
            open_store(settings).upload_dir(adapter_dir, key)
            lineage = Lineage(
                tenant="default",
                job_id="job-0123456789abcdef0123",
                attempt=1,
                base_model=model.name,
                base_model_version=model.version,
                base_model_digest=model.digest,
                dataset="ds-0123456789abcdef",
                dataset_digest="0" * 64,
                lora=LoraSpec(),
                training=TrainingSpec(),
            )
            nc = await nats.connect(settings.nats_url)
            try:
                msg = await nc.request(
                    Subjects(settings.namespace).registry("adapters.register"),
                    RegisterAdapter(name="bot", store_key=key, lineage=lineage)
                    .model_dump_json()
                    .encode(),
                    timeout=10,
                )
            finally:
                await nc.close()
            registered = Reply[AdapterVersion].model_validate_json(msg.data)
            assert registered.ok, registered.error

            await asyncio.to_thread(client.set_alias, "bot", "prod", 1)
            # Every command that takes an adapter reads NAME, NAME@VERSION and NAME@ALIAS.
            for ref in ("bot", "bot@1", "bot@prod"):
                show = ["--url", gw.url, "adapters", "show", ref, "--json"]
                shown = await asyncio.to_thread(CliRunner().invoke, cli, show)
                assert shown.exit_code == 0, shown.output
                assert json.loads(shown.output)["version"] == 1
            unknown = ["--url", gw.url, "adapters", "show", "bot@nope"]
            refused = await asyncio.to_thread(CliRunner().invoke, cli, unknown)
            assert refused.exit_code == 2, refused.output
            assert "nope" in refused.output, refused.output

            out = tmp_path / "pulled"
            pull = ["adapters", "pull", "bot@prod", "--with-base", "--out", str(out)]
            args = ["--url", gw.url, *pull]
            result = await asyncio.to_thread(CliRunner().invoke, cli, args)
            assert result.exit_code == 0, result.output
            # The async SDK pulls the same directory.
            async_out = tmp_path / "pulled-async"
            async with AsyncClient(gw.url) as aclient:
                await aclient.pull_adapter_with_base("bot", 1, async_out)

    # The base is named relative to the adapter's directory: the directory can move.
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "./base"
    async_config = json.loads((async_out / "adapter_config.json").read_text())
    assert async_config["base_model_name_or_path"] == "./base"
    for f in sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()):
        if f.name != "adapter_config.json":
            assert (async_out / f).read_bytes() == (out / f).read_bytes(), f
    # What the registry holds names the Hub id the base model was registered from.
    registered_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert registered_config["base_model_name_or_path"] == HUB_ID

    moved = tmp_path / "elsewhere" / "copy"
    moved.parent.mkdir()
    shutil.move(out, moved)
    ids = torch.tensor([[1, 300, 301, 302, 303, 304]])
    # From inside the moved directory, as the README says ...
    monkeypatch.chdir(moved)
    auto = AutoPeftModelForCausalLM.from_pretrained(".").eval()
    monkeypatch.chdir(tmp_path)
    # ... and from anywhere, naming its base directory.
    anywhere = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(moved / "base", use_safetensors=True), moved
    ).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True)
    with torch.no_grad():
        plain = base(ids).logits.clone()
        expected = PeftModel.from_pretrained(base, adapter_dir).eval()(ids).logits
        got = auto(ids).logits
        got_anywhere = anywhere(ids).logits
    assert not torch.allclose(plain, expected, atol=1e-3)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(got_anywhere, expected, atol=1e-5)

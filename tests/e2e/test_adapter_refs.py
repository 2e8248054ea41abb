"""Every CLI command that takes an adapter takes ``name`` (the latest), ``name@VERSION`` and
``name@ALIAS``, on the real stack: two versions of one adapter, an alias on the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm_contracts.jobs import JobState

from .conftest import Stack

pytestmark = pytest.mark.slow

NAME = "e2e-refs"


def two_versions(stack: Stack) -> None:
    spec = {
        "name": NAME,
        "base_model": "tiny-llama",
        "dataset": stack.train.id,
        "lora": {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj"]},
        "training": {"max_steps": 1, "batch_size": 2, "seq_len": 64, "checkpoint_every": 1},
    }
    for key in ("refs-1", "refs-2"):
        job = stack.client.submit(spec, idempotency_key=key)
        record = stack.client.wait(job.job_id, timeout=300)
        assert record.state == JobState.succeeded, record.reason
    stack.client.set_alias(NAME, "prod", 1)


def test_show_pull_and_export_take_a_name_a_version_and_an_alias(
    stack: Stack, tmp_path: Path
) -> None:
    two_versions(stack)
    cli = CliRunner()
    url = ["--url", stack.local.gateway_url]
    expected = {NAME: 2, f"{NAME}@2": 2, f"{NAME}@1": 1, f"{NAME}@prod": 1}
    for ref, version in expected.items():
        shown = cli.invoke(app, [*url, "adapters", "show", ref, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["version"] == version, ref

        out = tmp_path / ref.replace("@", "-at-")
        pulled = cli.invoke(app, [*url, "adapters", "pull", ref, "--out", str(out), "--json"])
        assert pulled.exit_code == 0, pulled.output
        assert json.loads(pulled.output)["version"] == version, ref
        assert (out / "adapter_model.safetensors").is_file()

        exported = cli.invoke(app, [*url, "adapters", "export", ref, "--json"])
        assert exported.exit_code == 0, exported.output
        assert json.loads(exported.output)["adapter"] == f"{NAME}@{version}", ref

    for bad in (f"{NAME}@9", f"{NAME}@staging"):
        for command in ("show", "pull", "export"):
            refused = cli.invoke(app, [*url, "adapters", command, bad])
            assert refused.exit_code != 0, (command, bad, refused.output)
            said = refused.output
            assert "404" in said, (command, bad, said)
            assert bad.split("@")[1] in said, (command, bad, said)  # which version or alias

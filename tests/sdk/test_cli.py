"""The CLI's argument handling and --json output against a real gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import Client, NotFoundError, ValidationError
from swarm_contracts.events import Failed, Progress, Succeeded, Validated
from swarm_contracts.jobs import AdapterRef, JobRecord, JobSpec, JobState
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

runner = CliRunner()


def cli(gateway_url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", gateway_url, *args])
    return result.exit_code, result.output


@pytest.fixture
def dataset_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)))
    return path


def test_dataset_upload_and_list_json(gateway, dataset_file: Path) -> None:  # type: ignore[no-untyped-def]
    code, out = cli(gateway.url, "datasets", "upload", str(dataset_file), "--json")
    assert code == 0, out
    info = json.loads(out)
    assert info["id"].startswith("ds-")
    assert info["name"] == "train.jsonl"
    code, out = cli(gateway.url, "datasets", "--json")
    assert code == 0
    assert [d["id"] for d in json.loads(out)] == [info["id"]]
    code, out = cli(gateway.url, "datasets", "ls")
    assert code == 0
    assert info["id"] in out


def test_bad_dataset_reports_the_line(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\nnope\n')
    code, out = cli(gateway.url, "datasets", "upload", str(bad))
    assert code == 2
    assert "line 3" in out


def test_submit_and_spec_errors(gateway, dataset_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ds = Client(gateway.url).upload_dataset(dataset_file).id
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: bot\nbase_model: tiny-llama\ndataset: {ds}\ntraining: {{max_steps: 5}}\n"
    )
    code, out = cli(gateway.url, "submit", str(spec), "--json", "--idempotency-key", "k")
    assert code == 0, out
    record = json.loads(out)
    assert record["state"] == "queued"
    assert record["spec"]["training"]["max_steps"] == 5

    spec.write_text(
        f"name: bot\nbase_model: tiny-llama\ndataset: {ds}\ntraining: {{max_stepz: 5}}\n"
    )
    code, out = cli(gateway.url, "submit", str(spec))
    assert code == 2
    assert "training.max_stepz" in out

    code, out = cli(gateway.url, "submit", str(tmp_path / "missing.yaml"))
    assert code == 2  # typer rejects the missing file itself

    with pytest.raises(ValidationError) as info:
        Client(gateway.url).submit({"name": "bot", "base_model": "x", "dataset": "nope"})
    assert info.value.status_code == 422
    assert "dataset" in str(info.value)


def test_missing_job_and_registry_down(gateway) -> None:  # type: ignore[no-untyped-def]
    code, out = cli(gateway.url, "jobs", "show", "job-0123456789")
    assert code == 2
    assert "not found" in out
    with pytest.raises(NotFoundError):
        Client(gateway.url).get_job("job-0123456789")
    code, out = cli(gateway.url, "models", "--json")
    assert code == 2
    assert "registry" in out
    code, out = cli(gateway.url, "workers", "--json")
    assert code == 0
    assert json.loads(out) == []


def test_unreachable_gateway_is_a_clear_error() -> None:
    code, out = cli("http://127.0.0.1:9", "jobs")
    assert code == 2
    assert "cannot reach" in out


@pytest.mark.parametrize("module", ["swarm", "swarm.cli"])
def test_python_m_runs_the_cli(module: str) -> None:
    """`python -m swarm` is the `swarm` command, every group joined in."""
    ran = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert ran.returncode == 0, ran.stderr
    assert "Usage: swarm " in ran.stdout, ran.stdout
    commands = {"up", "demo", "submit", "chat", "jobs", "models", "datasets", "adapters"}
    commands |= {"sweep", "sweeps", "workers", "providers"}
    listed = {line.split()[1] for line in ran.stdout.splitlines() if line.startswith("│ ")}
    assert commands <= listed, ran.stdout


async def test_jobs_listing_and_follow(gateway, settings: Settings, dataset_file: Path) -> None:  # type: ignore[no-untyped-def]
    subjects = Subjects(settings.namespace)
    c = Client(gateway.url)
    ds = c.upload_dataset(dataset_file).id
    spec = JobSpec(name="bot", base_model="tiny-llama", dataset=ds)
    nc = await nats.connect(settings.nats_url)
    broker = make_broker(settings, "test")
    await broker.start()
    try:
        jobs = RecordTable(await kv_bucket(nc.jetstream(), subjects, "jobs"), JobRecord)
        good, bad = "job-00000000000a", "job-00000000000b"
        adapter = AdapterRef(name="bot", version=3, store_key="adapters/default/bot/3")
        await jobs.create(
            good,
            JobRecord(
                job_id=good, tenant="default", spec=spec, state=JobState.succeeded, adapter=adapter
            ),
        )
        await jobs.create(
            bad,
            JobRecord(
                job_id=bad,
                tenant="default",
                spec=spec,
                state=JobState.failed,
                reason="out of memory",
            ),
        )
        for event in (
            Progress(job_id=good, step=5, max_steps=10, loss=1.5, lr=1e-3, tokens_per_s=900.0),
            Validated(job_id=good, step=10, eval_loss=0.75, perplexity=2.1),
            Succeeded(job_id=good, adapter=adapter),
            Failed(job_id=bad, reason="out of memory"),
        ):
            await publish_job_event(broker, subjects, "test", event)

        code, out = cli(gateway.url, "jobs", "--json")
        assert code == 0
        assert {j["job_id"] for j in json.loads(out)} == {good, bad}
        code, out = cli(gateway.url, "jobs", "ls", "--state", "failed", "--json")
        assert [j["job_id"] for j in json.loads(out)] == [bad]
        code, out = cli(gateway.url, "jobs", "show", good, "--json")
        assert code == 0
        assert json.loads(out)["adapter"]["version"] == 3

        code, out = cli(gateway.url, "jobs", "follow", good)
        assert code == 0, out
        assert "bot v3" in out
        assert "0.7500" in out
        code, out = cli(gateway.url, "jobs", "follow", bad)
        assert code == 1
        assert "out of memory" in out

        events = [e.event for e in c.events(good)]
        assert events == ["progress", "validated", "succeeded"]
    finally:
        await broker.stop()
        await nc.close()


def test_a_background_upload_shows_its_check_until_done(  # type: ignore[no-untyped-def]
    gateway, dataset_file: Path, tmp_path: Path
) -> None:
    code, out = cli(gateway.url, "datasets", "upload", str(dataset_file), "--background")
    assert code == 0, out
    assert "dataset ds-" in out
    assert "3 text examples" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\nnope\n')
    code, out = cli(gateway.url, "datasets", "upload", str(bad), "--background")
    assert code == 1
    assert "not a dataset" in out
    assert "line 3" in out

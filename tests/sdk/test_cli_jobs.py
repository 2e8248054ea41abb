"""`swarm jobs follow/events/show --plot` against a real gateway and events stream."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nats
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import Client
from swarm_contracts.events import Failed, Progress, Queued, Succeeded, Validated
from swarm_contracts.jobs import AdapterRef, JobRecord, JobSpec, JobState
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

from ..conftest import ServerThread

runner = CliRunner()
GOOD, BAD = "job-0000000000c1", "job-0000000000c2"


def cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", url, *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def seed(settings: Settings, url: str, tmp_path: Path) -> None:
    """Two finished jobs with their events: one trained for 10 steps, one failed."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)))
    ds = Client(url).upload_dataset(data).id
    spec = JobSpec(name="bot", base_model="tiny-llama", dataset=ds)
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    broker = make_broker(settings, "test")
    await broker.start()
    try:
        jobs = RecordTable(await kv_bucket(nc.jetstream(), subjects, "jobs"), JobRecord)
        adapter = AdapterRef(name="bot", version=2, store_key="adapters/default/bot/2")
        await jobs.create(
            GOOD,
            JobRecord(
                job_id=GOOD, tenant="default", spec=spec, state=JobState.succeeded, adapter=adapter
            ),
        )
        await jobs.create(
            BAD,
            JobRecord(job_id=BAD, tenant="default", spec=spec, state=JobState.failed, reason="oom"),
        )
        events: list = [Queued(job_id=GOOD, tenant="default", spec=spec)]
        events += [
            Progress(
                job_id=GOOD,
                step=s,
                max_steps=10,
                loss=2.0 / s,
                lr=1e-3,
                tokens_per_s=500.0,
                elapsed_s=2.0 * s,
            )
            for s in (1, 5)
        ]
        events += [
            Validated(job_id=GOOD, step=5, eval_loss=0.9, perplexity=2.5),
            Succeeded(job_id=GOOD, adapter=adapter),
            Failed(job_id=BAD, reason="oom"),
        ]
        for event in events:
            await publish_job_event(broker, subjects, "test", event)
    finally:
        await broker.stop()
        await nc.close()


async def test_follow_events_and_plot(
    gateway: ServerThread, settings: Settings, tmp_path: Path
) -> None:
    await seed(settings, gateway.url, tmp_path)

    code, out = cli(gateway.url, "jobs", "follow", GOOD)
    assert code == 0, out
    # Step 5 of 10 after 10 s: 5 steps left at 2 s each.
    assert "5/10" in out
    assert "eta 0:00:10" in out
    assert "500 tok/s" in out
    assert "bot v2" in out
    # How long the user waited for training to start: from `queued` to the first `progress`.
    assert re.search(r"first step \d+\.\d s after it was queued", out), out
    code, out = cli(gateway.url, "jobs", "follow", BAD)
    assert code == 1
    assert "oom" in out

    code, out = cli(gateway.url, "jobs", "events", GOOD, "--json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in lines] == [
        "swarm.job.queued",
        "swarm.job.progress",
        "swarm.job.progress",
        "swarm.job.validated",
        "swarm.job.succeeded",
    ]
    code, out = cli(gateway.url, "jobs", "events", GOOD, "--after", lines[2]["seq"])
    assert code == 0
    assert out.split()[1] == "validated"
    assert "eval_loss=0.9" in out

    png = tmp_path / "loss.png"
    code, out = cli(gateway.url, "jobs", "show", GOOD, "--plot", str(png), "--json")
    assert code == 0, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000
    assert json.loads(out[out.index("{") :])["job_id"] == GOOD

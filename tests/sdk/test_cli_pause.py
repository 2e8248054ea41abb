"""`swarm jobs pause/resume` and `swarm submit --from-checkpoint` against a real gateway: the
control requests reach the control stream with their reason, `--wait` waits for the record to
say paused (exit 1 if the job ended instead), and a fork's starting point is on the spec."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
from nats.js.errors import NotFoundError
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import Client
from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.subjects import Subjects
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import kv_bucket

from ..conftest import ServerThread

runner = CliRunner()
RUNNING, PAUSED, ENDING = "job-00000000a1", "job-00000000a2", "job-00000000a3"


def cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", url, *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def test_pause_resume_and_wait(
    gateway: ServerThread, settings: Settings, tmp_path: Path
) -> None:
    url = gateway.url
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)))
    spec = JobSpec(name="bot", base_model="tiny-llama", dataset=Client(url).upload_dataset(data).id)
    subjects = Subjects(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)

    def record(job_id: str, state: JobState) -> JobRecord:
        return JobRecord(job_id=job_id, tenant="default", spec=spec, state=state, worker_id="w1")

    async def move(job_id: str, state: JobState, reason: str) -> None:
        found = await jobs.get(job_id)
        assert found is not None
        new = found[0].model_copy(update={"state": state, "reason": reason, "worker_id": None})
        await jobs.update(job_id, new, found[1])

    async def sent(subject: str) -> dict:
        msg = await js.get_last_msg(subjects.control_stream, subject)
        return json.loads(msg.data)["data"]

    async def sequence(subject: str) -> int:
        try:
            return (await js.get_last_msg(subjects.control_stream, subject)).seq or 0
        except NotFoundError:
            return 0

    async def requested_after(subject: str, seq: int) -> None:
        """Until `--wait`'s own request is on the control stream: only then may the test end
        the job (before, the request would find it ended: a 409, not a wait)."""
        for _ in range(300):
            if await sequence(subject) > seq:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no request on {subject}")

    try:
        await jobs.create(RUNNING, record(RUNNING, JobState.running))
        await jobs.create(PAUSED, record(PAUSED, JobState.paused))
        await jobs.create(ENDING, record(ENDING, JobState.running))

        code, out = cli(url, "jobs", "pause", RUNNING, "--reason", "lunch")
        assert code == 0, out
        assert f"pause requested for {RUNNING} (was running)" in out
        assert await sent(subjects.pause(RUNNING)) == {"job_id": RUNNING, "reason": "lunch"}
        code, out = cli(url, "jobs", "pause", PAUSED)
        assert code == 2
        assert "already paused" in out

        code, out = cli(url, "jobs", "resume", PAUSED, "--reason", "back", "--json")
        assert code == 0, out
        assert json.loads(out)["job_id"] == PAUSED
        assert await sent(subjects.resume(PAUSED)) == {"job_id": PAUSED, "reason": "back"}
        code, out = cli(url, "jobs", "resume", RUNNING)
        assert code == 2
        assert "not paused" in out

        # --wait: until the record says paused, or exit 1 when the job ended instead.
        before = await sequence(subjects.pause(RUNNING))
        waiting = asyncio.create_task(
            asyncio.to_thread(cli, url, "jobs", "pause", RUNNING, "--wait", "--timeout", "30")
        )
        await requested_after(subjects.pause(RUNNING), before)
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await move(RUNNING, JobState.paused, "paused: paused by request")
        code, out = await waiting
        assert code == 0, out
        assert f"{RUNNING} paused: paused by request" in out

        waiting = asyncio.create_task(
            asyncio.to_thread(cli, url, "jobs", "pause", ENDING, "--wait", "--timeout", "30")
        )
        await requested_after(subjects.pause(ENDING), 0)
        await move(ENDING, JobState.failed, "oom")
        code, out = await waiting
        assert code == 1, out
        assert f"{ENDING} failed instead of pausing: oom" in out
    finally:
        await nc.close()


def test_submit_from_checkpoint(gateway: ServerThread, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)))
    ds = Client(gateway.url).upload_dataset(data).id
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: bot\nbase_model: tiny-llama\ndataset: {ds}\n")

    code, out = cli(gateway.url, "submit", str(spec), "--with-optimizer")
    assert code == 2
    assert "--with-optimizer needs --from-checkpoint" in out

    # No registry behind this gateway: the scheduler pins (or refuses) the checkpoint later.
    source = "job-00000000b1@8"
    args = ("submit", str(spec), "--from-checkpoint", source, "--with-optimizer", "--json")
    code, out = cli(gateway.url, *args)
    assert code == 0, out
    submitted = json.loads(out)["spec"]
    assert (submitted["from_checkpoint"], submitted["from_checkpoint_optimizer"]) == (source, True)
    code, out = cli(gateway.url, "submit", str(spec), "--from-checkpoint", source)
    assert code == 0, out
    assert f"forks {source} (weights)" in out
    code, out = cli(gateway.url, "submit", str(spec), "--from-checkpoint", "job-1@x")
    assert code == 2
    assert "from_checkpoint" in out

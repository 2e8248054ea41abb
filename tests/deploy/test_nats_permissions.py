"""deploy/nats/nats-auth.conf on a real nats-server: each service can do its job as its own
user, and is refused a subject it must not publish."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest

from swarm_contracts.envelope import envelope
from swarm_contracts.events import PauseRequest
from swarm_contracts.jobs import JobSpec, JobSubmission, ModelRef, job_id_for
from swarm_contracts.replies import Reply
from swarm_contracts.sessions import PLACE_SESSION, RELEASE_SESSION, PlaceSession, ReleaseSession
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Heartbeat, Resources, WorkerBenchmark
from swarm_gateway import create_app
from swarm_gateway.tinker.calls import Calls
from swarm_runtime.settings import Settings

from ..conftest import free_port, nats_server_binary, wait_for_port
from ..scheduler.conftest import write_fake_model

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-auth.conf"
SERVICES = ("gateway", "scheduler", "trainer", "registry", "telemetry", "sweeps", "inference")


def password(service: str) -> str:
    return f"pw-{service}-0123"


def shipped_config(tmp: Path) -> Path:
    """A copy of the shipped file, with only the store directory moved somewhere writable."""
    conf = tmp / "nats.conf"
    conf.write_text(CONFIG.read_text().replace("store_dir: /data", f"store_dir: {tmp / 'js'}"))
    return conf


def run_nats(conf: Path) -> Iterator[str]:
    """nats-server with ``conf`` and every service's password in its environment; its log
    next to the config."""
    port = free_port()
    env = os.environ | {f"{s.upper()}_NATS_PASSWORD": password(s) for s in SERVICES}
    binary = nats_server_binary()
    log = conf.with_suffix(".log")
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-m", "0", "-l", str(log)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_nats(shipped_config(tmp_path_factory.mktemp("nats-auth")))


def as_service(url: str, service: str, tmp_path: Path) -> Settings:
    return Settings(
        nats_url=url,
        nats_user=service,
        nats_password=password(service),  # type: ignore[arg-type]
        store_url=(tmp_path / "store").as_uri(),
    )


async def connect(url: str, service: str) -> tuple[nats.NATS, list[str]]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        url,
        user=service,
        password=password(service),
        error_cb=on_error,
        allow_reconnect=False,
        # Each service may subscribe under its own inbox prefix only.
        inbox_prefix=Subjects.service_inbox(service),
    )
    return nc, errors


async def refused_subscription(nc: nats.NATS, errors: list[str], subject: str) -> bool:
    await nc.subscribe(subject)
    await nc.flush()
    await asyncio.sleep(0.2)  # the server's -ERR arrives asynchronously
    expected = f'permissions violation for subscription to "{subject.lower()}"'
    return any(expected in e.lower() for e in errors)


async def denied(nc: nats.NATS, errors: list[str], subject: str) -> bool:
    await nc.publish(subject, b"{}")
    await nc.flush()
    await asyncio.sleep(0.2)  # the server's -ERR arrives asynchronously
    # nats-py lower-cases the server's message.
    expected = f'permissions violation for publish to "{subject.lower()}"'
    return any(expected in e.lower() for e in errors)


async def gateways_ping_each_other(url: str, gateway: nats.NATS, futures: Any) -> None:
    other, other_errors = await connect(url, "gateway")
    subjects = Subjects()
    pinging, pinged = Calls(gateway, subjects, futures), Calls(other, subjects, futures)
    await pinging.start()
    await pinged.start()
    assert await pinging.answers(pinged.inbox)
    assert not other_errors
    await other.close()  # that gateway died: once the server has seen it go, no answer
    for _ in range(50):
        if not await pinging.answers(pinged.inbox):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("a closed gateway's inbox still answered")
    await pinging.stop()


async def pause_resume_and_fork(
    c: httpx.AsyncClient, secured_nats: str, job_id: str, dataset: str
) -> None:
    """Gateway -> scheduler on the control stream: a pause (published as the gateway user:
    the API pauses only a running job, and a queued one is paused at once) and a resume;
    scheduler -> registry: a job forking a checkpoint of that job, which never ran (the
    gateway refuses it up front, so it comes over NATS): the registry's refusal, not a
    permission error, fails it."""

    async def state_of(job: str, wanted: str) -> str | None:
        state = None
        for _ in range(100):
            found = await c.get(f"/v1/jobs/{job}")
            state = found.json()["state"] if found.status_code == 200 else None
            if state == wanted:
                break
            await asyncio.sleep(0.1)
        return state

    control, control_errors = await connect(secured_nats, "gateway")
    try:
        pause = envelope("gateway", "swarm.job.pause", PauseRequest(job_id=job_id))
        await control.jetstream().publish(
            f"swarm.jobs.{job_id}.pause", pause.model_dump_json().encode()
        )
        assert await state_of(job_id, "paused") == "paused"
        resumed = await c.post(f"/v1/jobs/{job_id}/resume")
        assert resumed.status_code == 202, resumed.text
        assert await state_of(job_id, "queued") == "queued"

        fork_id = job_id_for("default", "fork")
        spec = JobSpec(
            name="bot", base_model="tiny", dataset=dataset, from_checkpoint=f"{job_id}@1"
        )
        submit = envelope("gateway", "swarm.job.submit", JobSubmission(spec=spec, job_id=fork_id))
        await control.jetstream().publish(
            "swarm.jobs.submit", submit.model_dump_json().encode(), headers={"Nats-Msg-Id": "f"}
        )
        assert await state_of(fork_id, "failed") == "failed"
        forked = (await c.get(f"/v1/jobs/{fork_id}")).json()
        assert "never ran" in forked["reason"], forked
    finally:
        await control.close()
    assert not control_errors


async def test_services_work_and_are_fenced(secured_nats: str, tmp_path: Path) -> None:
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_sweeps.app import build_app as build_sweeps
    from swarm_telemetry.app import build_app as build_telemetry

    with pytest.raises(nats.errors.Error):
        await nats.connect(secured_nats, user="gateway", password="wrong", allow_reconnect=False)

    gw_settings = as_service(secured_nats, "gateway", tmp_path)
    app = create_app(gw_settings, submit_wait_s=5.0, request_timeout_s=5.0)
    # Telemetry replays the events stream through an ordered consumer (its own inbox).
    telemetry = build_telemetry(as_service(secured_nats, "telemetry", tmp_path))
    async with (
        telemetry.app,
        build_registry(as_service(secured_nats, "registry", tmp_path)),
        build_scheduler(as_service(secured_nats, "scheduler", tmp_path)),
        build_sweeps(as_service(secured_nats, "sweeps", tmp_path)),
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
    ):
        # Gateway -> registry (request/reply, store) and gateway -> scheduler (submit stream).
        write_fake_model(tmp_path / "model")
        files = [("files", (p.name, p.read_bytes())) for p in (tmp_path / "model").iterdir()]
        model = await c.post("/v1/models", data={"name": "tiny"}, files=files)
        assert model.status_code == 201, model.text
        data = "".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)).encode()
        ds = (await c.post("/v1/datasets", files={"file": ("d.jsonl", data)})).json()["id"]
        job = await c.post("/v1/jobs", json={"name": "bot", "base_model": "tiny", "dataset": ds})
        # 201: the scheduler (as its own user) consumed the submission and wrote the record.
        assert job.status_code == 201, job.text
        assert job.json()["state"] == "queued", job.text
        job_id = job.json()["job_id"]
        # Scheduler -> telemetry: the job's events (here `queued`) reach it, as its own user.
        for _ in range(100):
            if telemetry.series.get(job_id) is not None:
                break
            await asyncio.sleep(0.1)
        assert telemetry.series.get(job_id) is not None
        # OpenAI's side: the gateway writes its own bucket (openai_jobs), then submits.
        chat = json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n"
        file = await c.post(
            "/v1/files",
            files={"file": ("c.jsonl", (chat * 3).encode())},
            data={"purpose": "fine-tune"},
        )
        assert file.status_code == 200, file.text
        ftjob = await c.post(
            "/v1/fine_tuning/jobs", json={"model": "tiny", "training_file": file.json()["id"]}
        )
        assert ftjob.status_code == 200, ftjob.text
        assert ftjob.json()["status"] == "queued", ftjob.text
        listed = (await c.get("/v1/fine_tuning/jobs")).json()["data"]
        assert ftjob.json()["id"] in {j["id"] for j in listed}

        await pause_resume_and_fork(c, secured_nats, job_id, ds)

        # Gateway -> sweeps (submit stream) -> scheduler: the sweep's trials are queued jobs.
        search = {"training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-2}}
        sweep_spec = {
            "name": "bot",
            "base": {"base_model": "tiny", "dataset": ds},
            "search": search,
            "budget": 3,
        }
        sweep = await c.post("/v1/sweeps", json=sweep_spec)
        assert sweep.status_code == 201, sweep.text
        sweep_id = sweep.json()["sweep_id"]
        for _ in range(100):
            trials = (await c.get(f"/v1/sweeps/{sweep_id}")).json()["trials"]
            if len(trials) == 2 and all(t["state"] == "queued" for t in trials):
                break
            await asyncio.sleep(0.1)
        assert [t["state"] for t in trials] == ["queued", "queued"], trials
        assert (await c.get(f"/v1/jobs/{trials[0]['job_id']}")).json()["sweep"]["id"] == sweep_id

        # A trainer's heartbeat reaches the scheduler, which records the worker.
        trainer, trainer_errors = await connect(secured_nats, "trainer")
        res = Resources(cpus=2, memory_bytes=1 << 30)
        hb = Heartbeat(worker_id="w1", resources=res, free=res)
        await trainer.publish(
            "swarm.workers.w1.heartbeat",
            envelope("trainer", "swarm.worker.heartbeat", hb).model_dump_json().encode(),
        )
        for _ in range(50):
            workers = (await c.get("/v1/workers")).json()["data"]
            if workers:
                break
            await asyncio.sleep(0.1)
        assert [w["worker_id"] for w in workers] == ["w1"]
        assert not trainer_errors

        # Gateway -> trainer: `swarm workers benchmark w1`, answered on the gateway's inbox.
        measured = WorkerBenchmark(
            matmul_tflops=1.5, train_tokens_per_s=9e3, device="cpu", dtype="float32", duration_s=1
        )

        async def measure(msg: nats.aio.msg.Msg) -> None:
            await trainer.publish(msg.reply, Reply[WorkerBenchmark](ok=True, result=measured)
                                  .model_dump_json().encode())  # fmt: skip

        await trainer.subscribe("swarm.workers.w1.benchmark", cb=measure)
        # Scheduler -> trainer: a drain with move_jobs asks the worker to hand its jobs back.
        releases = await trainer.subscribe("swarm.workers.w1.release")
        await trainer.flush()
        bench = await c.post("/v1/workers/w1/benchmark")
        assert bench.status_code == 200, bench.text
        assert WorkerBenchmark.model_validate(bench.json()) == measured
        # Gateway -> scheduler: a training session's lease (written to the session_leases
        # bucket as the scheduler's user), then its release; on a worker with room to spare,
        # as the queued jobs fill w1.
        big = Resources(cpus=64, memory_bytes=1 << 30)
        hb = Heartbeat(worker_id="big", resources=big, free=big)
        await trainer.publish(
            "swarm.workers.big.heartbeat",
            envelope("trainer", "swarm.worker.heartbeat", hb).model_dump_json().encode(),
        )
        await asyncio.sleep(0.3)
        tiny = ModelRef(name="tiny", version=1, store_key="models/tiny/1", digest="d" * 16)
        session = "tsess-0123456789abcdef-train-0"
        asked = PlaceSession(session=session, tenant="default", base_model=tiny)
        lease = await app.state.gateway.scheduler.call(PLACE_SESSION, asked)
        assert (lease.worker_id, lease.attempt) == ("big", 1)
        ended = await app.state.gateway.scheduler.call(
            RELEASE_SESSION, ReleaseSession(session=session, attempt=1)
        )
        assert ended.state == "ended"
        scheduler, scheduler_errors = await connect(secured_nats, "scheduler")
        await scheduler.publish("swarm.workers.w1.release", b"{}")
        assert (await releases.next_msg(timeout=5)).subject == "swarm.workers.w1.release"
        await scheduler.close()
        assert not trainer_errors
        assert not scheduler_errors

        # Gateway -> inference worker: a request in the base model's queue group, answered
        # with several chunks on the gateway's inbox; heartbeats and cancels both ways.
        gateway, gateway_errors = await connect(secured_nats, "gateway")
        sweeps, sweeps_errors = await connect(secured_nats, "sweeps")
        inference, inference_errors = await connect(secured_nats, "inference")

        async def serve(msg: nats.aio.msg.Msg) -> None:
            for i in range(3):
                await inference.publish(msg.reply, f'{{"seq": {i}}}'.encode())

        await inference.subscribe("swarm.inference.tiny.1.generate", "inference-tiny-1", cb=serve)
        cancels = await inference.subscribe("swarm.inference.requests.*.cancel")
        beats = await gateway.subscribe("swarm.inference.workers.*.heartbeat")
        await inference.flush()  # the subscriptions are in place before anything is sent
        await gateway.flush()
        inbox = gateway.new_inbox()
        answers = await gateway.subscribe(inbox)
        await gateway.publish("swarm.inference.tiny.1.generate", b"{}", reply=inbox)
        got = [json.loads((await answers.next_msg(timeout=5)).data)["seq"] for _ in range(3)]
        assert got == [0, 1, 2]
        await gateway.publish("swarm.inference.requests.r1.cancel", b"{}")
        assert (await cancels.next_msg(timeout=5)).subject == "swarm.inference.requests.r1.cancel"
        await inference.publish("swarm.inference.workers.i1.heartbeat", b"{}")
        assert (await beats.next_msg(timeout=5)).subject == "swarm.inference.workers.i1.heartbeat"
        # Gateway -> gateway: one pings another's inbox (is it alive? its Tinker futures are
        # adopted when it is not), as two gateways of the shipped config.
        await gateways_ping_each_other(secured_nats, gateway, app.state.tinker.futures)
        assert not gateway_errors
        assert not inference_errors
        try:
            assert await denied(inference, inference_errors, "swarm.jobs.submit")
            assert await denied(inference, inference_errors, "swarm.workers.w1.heartbeat")
            assert await denied(inference, inference_errors, "$KV.swarm_adapters.x")
            assert await denied(gateway, gateway_errors, "swarm.inference.workers.i1.heartbeat")
            assert await denied(gateway, gateway_errors, f"swarm.sweeps.{sweep_id}.events.created")
            assert await denied(sweeps, sweeps_errors, f"swarm.jobs.{job_id}.events.succeeded")
            assert await denied(sweeps, sweeps_errors, f"$KV.swarm_jobs.{job_id}")
            assert await denied(sweeps, sweeps_errors, "swarm.workers.w1.assign")
            assert await denied(gateway, gateway_errors, f"swarm.jobs.{job_id}.events.succeeded")
            assert await denied(gateway, gateway_errors, "swarm.workers.w1.assign")
            assert await denied(gateway, gateway_errors, "swarm.workers.w1.heartbeat")
            assert await denied(gateway, gateway_errors, "swarm.workers.w1.release")
            assert await denied(trainer, trainer_errors, "swarm.workers.w2.benchmark")
            assert await denied(trainer, trainer_errors, "swarm.jobs.submit")
            # Only the gateway asks for a training session's room on a worker.
            assert await denied(trainer, trainer_errors, "swarm.scheduler.sessions.place")
            assert await denied(trainer, trainer_errors, "swarm.workers.w2.assign")
            assert await denied(trainer, trainer_errors, f"$KV.swarm_jobs.{job_id}")
            # A worker's events go on its own subject, to the scheduler; never the public one.
            assert await denied(trainer, trainer_errors, f"swarm.jobs.{job_id}.events.failed")
            # No service hears another identity's replies, deliveries or KV watches.
            for nc, errors in ((gateway, gateway_errors), (trainer, trainer_errors)):
                for inbox in ("_INBOX.>", "_INBOX.svc.scheduler.>", "_INBOX.worker.a.>"):
                    assert await refused_subscription(nc, errors, inbox), inbox
            # ...while an allowed subject raises nothing.
            before = len(trainer_errors)
            await trainer.publish("swarm.workers.w1.heartbeat", b"{}")
            await trainer.flush()
            await asyncio.sleep(0.2)
            assert len(trainer_errors) == before
        finally:
            await gateway.close()
            await sweeps.close()
            await inference.close()
            await trainer.close()

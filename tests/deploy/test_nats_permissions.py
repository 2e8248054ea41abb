"""deploy/nats/nats-auth.conf on a real nats-server: each service can do its job as its own
user, and is refused a subject it must not publish."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from swarm_common.envelope import envelope
from swarm_common.settings import Settings
from swarm_common.workers import Heartbeat, Resources
from swarm_gateway import create_app

from ..conftest import free_port, wait_for_port
from ..scheduler.conftest import write_fake_model

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-auth.conf"
SERVICES = ("gateway", "scheduler", "trainer", "registry", "telemetry")


def password(service: str) -> str:
    return f"pw-{service}-0123"


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("nats-auth")
    # The shipped file, with only the store directory moved somewhere writable.
    conf = tmp / "nats.conf"
    conf.write_text(CONFIG.read_text().replace("store_dir: /data", f"store_dir: {tmp / 'js'}"))
    port = free_port()
    env = os.environ | {f"{s.upper()}_NATS_PASSWORD": password(s) for s in SERVICES}
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-m", "0"],
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
        url, user=service, password=password(service), error_cb=on_error, allow_reconnect=False
    )
    return nc, errors


async def denied(nc: nats.NATS, errors: list[str], subject: str) -> bool:
    await nc.publish(subject, b"{}")
    await nc.flush()
    await asyncio.sleep(0.2)  # the server's -ERR arrives asynchronously
    # nats-py lower-cases the server's message.
    expected = f'permissions violation for publish to "{subject.lower()}"'
    return any(expected in e.lower() for e in errors)


async def test_services_work_and_are_fenced(secured_nats: str, tmp_path: Path) -> None:
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler

    with pytest.raises(nats.errors.Error):
        await nats.connect(secured_nats, user="gateway", password="wrong", allow_reconnect=False)

    gw_settings = as_service(secured_nats, "gateway", tmp_path)
    app = create_app(gw_settings, submit_wait_s=5.0, request_timeout_s=5.0)
    async with (
        build_registry(as_service(secured_nats, "registry", tmp_path)),
        build_scheduler(as_service(secured_nats, "scheduler", tmp_path)),
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
        assert job.status_code == 201 and job.json()["state"] == "queued", job.text
        job_id = job.json()["job_id"]

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

        # What each must not do.
        gateway, gateway_errors = await connect(secured_nats, "gateway")
        try:
            assert await denied(gateway, gateway_errors, f"swarm.jobs.{job_id}.events.succeeded")
            assert await denied(gateway, gateway_errors, "swarm.workers.w1.assign")
            assert await denied(trainer, trainer_errors, "swarm.jobs.submit")
            assert await denied(trainer, trainer_errors, "swarm.workers.w2.assign")
            assert await denied(trainer, trainer_errors, f"$KV.swarm_jobs.{job_id}")
            # ...while an allowed subject raises nothing.
            before = len(trainer_errors)
            await trainer.publish("swarm.workers.w1.heartbeat", b"{}")
            await trainer.flush()
            await asyncio.sleep(0.2)
            assert len(trainer_errors) == before
        finally:
            await gateway.close()
            await trainer.close()

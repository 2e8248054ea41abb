"""A Tinker training session and jobs take turns on a one-CPU worker: the scheduler leases the
session its room like a job's (docs/tinker.md, "Placement"). A job waits behind a session's
lane until the client closes the session; a session created while a job fills the worker waits
(its create future reads ``paused_capacity``, with the scheduler's reason) and is built once
the job is gone; one whose client closes its session meanwhile stops waiting, saying so."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import nats
import pytest
import tinker

from swarm_contracts.jobs import JobState
from swarm_contracts.subjects import Subjects

from ..tinker_data import logprobs
from .conftest import Procs, done, start_base

pytestmark = pytest.mark.slow


def _model_records(procs: Procs, bucket: str = "tinker_models") -> list[dict]:
    """The gateway's records of training models (or of their calls' futures)."""

    async def read() -> list[dict]:
        nc = await nats.connect(procs.nats.url)
        try:
            kv = await nc.jetstream().key_value(Subjects(procs.namespace).bucket(bucket))
            out = []
            for key in await kv.keys():
                entry = await kv.get(key)
                if entry.value:
                    out.append(json.loads(entry.value))
            return out
        except nats.js.errors.NoKeysError:
            return []
        finally:
            await nc.close()

    return asyncio.run(read())


def _service(procs: Procs) -> tinker.ServiceClient:
    url = f"http://127.0.0.1:{procs.gateway_port}"
    return tinker.ServiceClient(base_url=url, api_key="tml-local")


def test_a_session_and_jobs_take_turns_on_a_one_cpu_worker(procs: Procs) -> None:
    dataset = start_base(procs)
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1")
    procs.wait_worker("t1", lambda w: w["state"] == "alive", timeout=180)

    # The session's lane takes the worker's one CPU: a job waits for it, saying so.
    service = _service(procs)
    training = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result(
        timeout=180
    )
    assert logprobs(training)
    job_id = procs.submit(dataset, "behind-the-session")
    waiting = procs.wait(job_id, lambda r: r.reason is not None, timeout=60)
    assert waiting.state == JobState.queued
    assert waiting.reason == "waiting for 1 CPU to free up on a worker"
    time.sleep(2)
    assert procs.job(job_id).state == JobState.queued  # still: the lane is held
    service.close("success").result(timeout=60)  # its lease ends with it
    assert procs.wait(job_id, done).state == JobState.succeeded

    # A job fills the worker: a new session waits for room, then is built once the job is gone.
    long_job = procs.submit(dataset, "long", steps=100_000)
    procs.wait(long_job, lambda r: r.state == JobState.running)
    later, doomed = _service(procs), _service(procs)
    made: dict[str, object] = {}

    def create(name: str, service: tinker.ServiceClient) -> None:
        client = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
        try:
            made[name] = client.result(timeout=300)
        except tinker.RequestFailedError as exc:
            made[name] = exc

    creating = [
        threading.Thread(target=create, args=(name, service), daemon=True)
        for name, service in (("later", later), ("doomed", doomed))
    ]
    for thread in creating:
        thread.start()
    deadline = time.monotonic() + 60
    while len(queued := [r for r in _model_records(procs) if r["state"] == "queued"]) < 2:
        assert time.monotonic() < deadline, "the waiting models were never recorded"
        time.sleep(0.2)
    assert all(r["worker_id"] == "" for r in queued)
    time.sleep(2)
    assert not made  # still waiting: the job holds the worker
    # retrieve_future answers the SDK "paused_capacity", with the scheduler's reason.
    pending = [f for f in _model_records(procs, "tinker_futures") if f["state"] == "pending"]
    reason = "waiting for 1 CPU to free up on a worker for the session"
    assert [(f["op"], f["waiting"]) for f in pending] == [("create", reason)] * 2
    # A client that gives up while its model waits (its SDK stops polling): the wait ends, and
    # the future says why.
    doomed.close("interrupted").result(timeout=60)
    deadline = time.monotonic() + 30
    while not (
        failed := [f for f in _model_records(procs, "tinker_futures") if f["state"] == "failed"]
    ):
        assert time.monotonic() < deadline, "the closed model's wait never ended"
        time.sleep(0.2)
    assert [(f["op"], f["category"], f["error"]) for f in failed] == [
        ("create", "user", "the model was closed before it had room")
    ]
    r = procs.http.post(f"/v1/jobs/{long_job}/cancel")
    assert r.status_code == 202, r.text
    creating[0].join(timeout=240)
    assert isinstance(made.get("later"), tinker.TrainingClient), made
    assert logprobs(made["later"])  # type: ignore[arg-type]
    built = [r for r in _model_records(procs) if r["model_id"] in {q["model_id"] for q in queued}]
    assert sorted((r["worker_id"], r["state"], r["attempt"]) for r in built) == [
        ("", "closed", 1),
        ("t1", "ready", 1),
    ]
    later.close("success").result(timeout=60)

"""An adversarial provider on the shipped deploy/nats/nats-auth.conf (issue 21).

A real nats-server runs the shipped config with two providers added by ``swarm providers add``:
``honest``, whose real agent (as ``swarm-trainer join`` runs it: its join file, no store keys)
trains a tenant's job to the end, and ``evil``, whose credentials drive plain nats-py probes
at everything a provider could try to read or forge. The registry and the scheduler run as
their own users against a real S3 server. Every probe must be refused, and the refusal must be
visible: a permissions violation (the client's error callback and the server's log) or a
warning of the service that refused it; the honest job succeeds beside it all, once, and then
the honest worker holds a training session whose grants evil cannot use.

Long because: every probe runs against the one stack the module starts (a nats-server on the
shipped config, the services as their own users, the honest job running): split, each part
would start its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from pydantic import SecretStr

from swarm.providers import add_provider
from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.envelope import envelope
from swarm_contracts.events import Failed, Succeeded
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState
from swarm_contracts.providers import ATTEMPT_TOKEN_HEADER, ProviderCredentials, token_digest
from swarm_contracts.registry import Lineage, RegisterAdapter
from swarm_contracts.sessions import SessionLease
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Assignment
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, open_store
from swarm_scheduler.settings import SchedulerSettings
from swarm_trainer.settings import TrainerSettings

from ..conftest import S3Server
from ..deploy.test_nats_permissions import as_service, connect, run_nats, shipped_config
from ..scheduler.conftest import wait_record
from ..trainer.conftest import (  # session fixtures, used here too
    arithmetic_records,
    put_dataset,
    ray_cluster,  # noqa: F401
    tiny_model_dir,  # noqa: F401
)

pytestmark = pytest.mark.slow

S = Subjects()
TENANT = "victim"
JOB = "job-000000000000000000000000000000a1"


@dataclass
class Stack:
    url: str
    log: Path  # the nats-server's
    creds: dict[str, ProviderCredentials]
    dataset: DatasetInfo
    jobs: RecordTable[JobRecord]
    scheduler: nats.NATS  # a connection as the scheduler's user: reads what the test checks
    gateway: nats.NATS  # and one as the gateway's: what it sends, the test sends
    store: ObjectStore  # with the registry's keys
    assignment: Assignment  # the honest provider's, with its attempt token (stolen below)
    done: asyncio.Task[JobRecord]  # the honest job's end


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict]]:
    tmp = tmp_path_factory.mktemp("adversary")
    conf = shipped_config(tmp)
    creds = {
        name: add_provider(conf, tmp / "creds", name, None, S)[1] for name in ("honest", "evil")
    }
    for url in run_nats(conf):
        yield url, conf.with_suffix(".log"), creds


def with_s3(settings: Settings, server: S3Server, bucket: str) -> Settings:
    return settings.model_copy(
        update={
            "store_url": f"s3://{bucket}?endpoint={server.endpoint}",
            "s3_access_key": server.access_key,
            "s3_secret_key": SecretStr(server.secret_key),
        }
    )


async def first_assignment(scheduler: nats.NATS, worker: str) -> Assignment:
    """The assignment the scheduler sent ``worker`` (read as the scheduler: the theft of a
    token by whatever means, which the bus no longer allows, is the premise of the probes)."""
    sub = await scheduler.jetstream().subscribe(S.assign(worker), ordered_consumer=True)
    try:
        msg = await sub.next_msg(timeout=30)
        return Assignment.model_validate(json.loads(msg.data)["data"])
    finally:
        await sub.unsubscribe()


@pytest.fixture(scope="module")
async def stack(
    nats_url: tuple[str, Path, dict],
    s3_server: S3Server,
    tiny_model_dir: Path,  # noqa: F811
    ray_cluster: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """The registry, the scheduler and the honest provider's agent, with the honest job
    running (started) on it."""
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler
    from swarm_trainer.app import build_app as build_trainer
    from swarm_trainer.app import join_settings

    url, log, creds = nats_url
    tmp = tmp_path_factory.mktemp("adversary-stack")
    bucket = "adversary-" + os.urandom(4).hex()
    registry = with_s3(as_service(url, "registry", tmp), s3_server, bucket)
    # Sessions on providers' workers: the honest agent holds one once its job is done.
    scheduler_settings = SchedulerSettings.of(
        with_s3(as_service(url, "scheduler", tmp), s3_server, bucket), sessions_on_providers=True
    )
    store = open_store(registry)
    creds_path = tmp / "honest.creds.json"
    fd = os.open(creds_path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(creds["honest"].model_dump_json())
    agent = join_settings(
        TrainerSettings(
            nats_url=url,
            work_dir=tmp / "work",
            heartbeat_interval_s=0.5,
            trainer_cpus=1,
            benchmark_s=0,
            # Slow steps (0.4 s each): the probes below meet the job running.
            trainer_test_hook="slow_steps",
        ),
        creds_path,
    )
    assert agent.store_access == "signed"
    assert agent.s3_access_key is None
    gateway, _ = await connect(url, "gateway")
    scheduler, _ = await connect(url, "scheduler")
    try:
        async with (
            build_registry(registry),
            build_scheduler(scheduler_settings),
            build_trainer(agent),
        ):
            # The gateway's part: a base model, a tenant's private dataset, a submission.
            await asyncio.to_thread(store.upload_dir, tiny_model_dir, "models/tiny-llama/x")
            reply = await gateway.request(
                S.registry("models.register"),
                json.dumps({"name": "tiny-llama", "store_key": "models/tiny-llama/x"}).encode(),
                timeout=30,
            )
            assert json.loads(reply.data)["ok"], reply.data
            dataset = await asyncio.to_thread(put_dataset, store, arithmetic_records(), TENANT)
            datasets = await gateway.jetstream().key_value(S.bucket("datasets"))
            await datasets.put(f"{TENANT}.{dataset.id}", dataset.model_dump_json().encode())
            spec = {
                "name": "secret-bot",
                "base_model": "tiny-llama",
                "dataset": dataset.id,
                "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
                "training": {
                    "max_steps": 20,
                    "batch_size": 4,
                    "seq_len": 64,
                    "eval_every": 10,
                    "checkpoint_every": 10,
                    "warmup_steps": 1,
                },
                "resources": {"workers": 1, "cpus_per_worker": 1},
            }
            submission = {"job_id": JOB, "tenant": TENANT, "spec": spec}
            event = {"specversion": "1.0", "id": JOB, "source": "test", "type": "submit"}
            await gateway.jetstream().publish(
                S.submit, json.dumps(event | {"data": submission}).encode()
            )
            jobs = RecordTable(await scheduler.jetstream().key_value(S.bucket("jobs")), JobRecord)
            record = await wait_record(jobs, JOB, lambda r: r.state == JobState.running, 120)
            assert record.worker_id == "honest"
            assignment = await first_assignment(scheduler, "honest")
            assert assignment.attempt_token
            done = asyncio.create_task(
                wait_record(jobs, JOB, lambda r: r.state.terminal, timeout=240)
            )
            yield Stack(url, log, creds, dataset, jobs, scheduler, gateway, store, assignment, done)
            await done
    finally:
        await gateway.close()
        await scheduler.close()


class Evil:
    """Provider ``evil``'s own connection, as any client would make it, and what it heard."""

    def __init__(self, nc: nats.NATS, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors
        self.heard: list[str] = []

    async def refused(self, kind: str, subject: str) -> bool:
        await self.nc.flush()
        for _ in range(20):  # the server's -ERR arrives asynchronously
            if f'permissions violation for {kind} to "{subject.lower()}"' in " ".join(self.errors):
                return True
            await asyncio.sleep(0.1)
        return False

    async def listen(self, subject: str) -> bool:
        async def heard(msg: Any) -> None:
            self.heard.append(msg.subject)

        await self.nc.subscribe(subject, cb=heard)
        return await self.refused("subscription", subject)

    async def send(self, subject: str, body: bytes = b"{}", **kw: Any) -> bool:
        await self.nc.publish(subject, body, reply=self.nc.new_inbox(), **kw)
        return await self.refused("publish", subject)

    async def ask(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        msg = await self.nc.request(subject, json.dumps(body).encode(), timeout=10)
        return json.loads(msg.data)


@pytest.fixture
async def evil(stack: Stack) -> AsyncIterator[Evil]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(
        stack.url,
        nkeys_seed_str=stack.creds["evil"].nkey_seed,
        error_cb=on_error,
        allow_reconnect=False,
        name="evil-probe",
        # Its own inbox prefix: the one its permissions let it hear its replies on.
        inbox_prefix=S.worker_inbox("evil"),
    )
    try:
        yield Evil(nc, errors)
    finally:
        await nc.close()


def server_log(stack: Stack) -> str:
    return stack.log.read_text()


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def test_forged_events_never_reach_the_record_or_anyone_following_the_job(
    stack: Stack, evil: Evil, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21, points 2 and 6: a ``failed`` for the honest provider's job, sent by evil
    with no token, a guessed one and the attempt's own (stolen) token, on evil's own subject
    (the only one NATS lets it use: the scheduler knows the sender), on the honest worker's
    and on the public subject: the record is untouched and the public events stream, which
    the gateway's SSE, telemetry and sweeps read, never carries them."""
    stolen = stack.assignment.attempt_token or ""
    caplog.set_level(logging.WARNING, logger="swarm.scheduler")
    record = (await stack.jobs.get(JOB))[0]  # type: ignore[index]
    assert record.state == JobState.running, record  # (the forgeries must meet a live job)
    forged_failed = Failed(job_id=JOB, attempt=1, reason="FORGED by provider evil")
    adapter = AdapterRef(name="secret-bot", version=99, store_key="adapters/evil/loot/1")
    forged_success = Succeeded(job_id=JOB, attempt=1, adapter=adapter, metrics={"eval_loss": 0})
    js = evil.nc.jetstream()
    for token in ("", "guessed", stolen):
        for event in (forged_failed, forged_success):
            body = envelope("trainer", event.event, event).model_dump_json().encode()
            headers = {ATTEMPT_TOKEN_HEADER: token} if token else {}
            # Its own subject: stored in the workers' events stream, read by the scheduler.
            await js.publish(S.worker_event("evil", JOB, event.event), body, headers=headers)
            # Another worker's subject and the public one: refused by NATS.
            for subject in (
                S.worker_event("honest", JOB, event.event),
                S.job_event(JOB, event.event),
            ):
                assert await evil.send(subject, body, headers=headers), subject

    # The scheduler's warnings: one per forgery it read on evil's subject.
    refusals: list[str] = []
    for _ in range(100):
        refusals = [m for m in messages(caplog) if m.startswith("refused") and "worker evil" in m]
        if len(refusals) >= 6:
            break
        await asyncio.sleep(0.1)
    assert len(refusals) == 6, refusals
    assert all("not this worker's" in m for m in refusals), refusals


async def test_evil_gets_no_store_grant_or_registration_for_anothers_job(
    stack: Stack, evil: Evil, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21, point 2: a presigned URL for the honest job's dataset and a registration in
    its name, even with its attempt's (stolen) token, asked on evil's own subject (the only
    one it may use: the registry knows who asks) or on anyone else's."""
    caplog.set_level(logging.WARNING, logger="swarm_registry.app")
    stolen = stack.assignment.attempt_token or ""
    grant = {
        "job_id": JOB,
        "attempt": 1,
        "attempt_token": stolen,
        "op": "get",
        "key": stack.dataset.store_key,
    }
    reply = await evil.ask(S.worker_registry("store.access", "evil"), grant)
    assert reply["code"] == "forbidden", reply
    assert reply.get("result") is None  # no URL
    # In the honest job's name, with its token, a made-up metric and its tenant's dataset.
    assignment = stack.assignment
    lineage = Lineage(
        tenant=TENANT,
        job_id=JOB,
        attempt=1,
        base_model=assignment.base_model.name,
        base_model_version=assignment.base_model.version,
        base_model_digest=assignment.base_model.digest,
        dataset=stack.dataset.id,
        dataset_digest=stack.dataset.sha256,
        lora=assignment.spec.lora,
        training=assignment.spec.training,
        metrics={"eval_loss": 0.01},
        worker_id="evil",
    )
    registration = RegisterAdapter(
        name="secret-bot",
        store_key=f"checkpoints/{JOB}/attempt-1",
        lineage=lineage,
        attempt_token=stolen,
    ).model_dump(mode="json")
    reply = await evil.ask(S.worker_registry("adapters.register", "evil"), registration)
    assert reply["code"] == "forbidden", reply
    for subject in (
        S.worker_registry("store.access", "honest"),
        S.worker_registry("adapters.register", "honest"),
        S.registry("store.access"),
        S.registry("adapters.register"),
        S.registry("models.list"),
    ):
        assert await evil.send(subject, json.dumps(grant).encode()), subject
    refused = [m for m in messages(caplog) if "to worker evil" in m]
    assert len(refused) == 2, refused
    assert refused[0].startswith("refused store access (get "), refused
    assert refused[1].startswith("refused registration"), refused


async def test_evil_reads_no_ones_replies_watches_or_records(stack: Stack, evil: Evil) -> None:
    """Issue 21, point 2: every inbox, KV watches of the jobs and workers buckets, stream
    listings with subjects_filter, records by id — all refused; it hears nothing."""
    # Other identities' inboxes, and all of them: the services' replies and KV watch traffic.
    for subject in (
        "_INBOX.>",
        "_INBOX.*.>",
        f"{S.service_inbox('scheduler')}.>",
        f"{S.service_inbox('registry')}.>",
        f"{S.worker_inbox('honest')}.>",
        "_INBOX.svc.>",
        # The buckets' own subjects, and every job's public events.
        f"$KV.{S.bucket('jobs')}.>",
        f"$KV.{S.bucket('workers')}.>",
        S.job_event(),
        S.worker_event("honest"),
        ">",
    ):
        assert await evil.listen(subject), subject

    # A KV watch (an ordered push consumer on the bucket's stream) and a bucket handle.
    for bucket in ("jobs", "workers"):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.Error, TimeoutError)):
            await evil.nc.jetstream(timeout=1).key_value(S.bucket(bucket))
        assert await evil.refused("publish", f"$JS.API.STREAM.INFO.KV_{S.bucket(bucket)}")
        consumer = f"$JS.API.CONSUMER.CREATE.KV_{S.bucket(bucket)}"
        assert await evil.send(consumer), consumer

    # Listing job ids and workers: stream info with subjects_filter, stream and consumer lists.
    listing = json.dumps({"subjects_filter": ">"}).encode()
    for stream in (
        S.events_stream,
        S.worker_events_stream,
        S.assign_stream,
        S.submit_stream,
        f"KV_{S.bucket('jobs')}",
        f"KV_{S.bucket('workers')}",
    ):
        subject = f"$JS.API.STREAM.INFO.{stream}"
        assert await evil.send(subject, listing), subject
        subject = f"$JS.API.CONSUMER.LIST.{stream}"
        assert await evil.send(subject), subject
    for subject in ("$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"):
        assert await evil.send(subject), subject

    # The honest job's record, by id, every way there is.
    jobs_stream = f"KV_{S.bucket('jobs')}"
    for subject in (
        f"$JS.API.DIRECT.GET.{jobs_stream}.$KV.{S.bucket('jobs')}.{JOB}",
        f"$JS.API.DIRECT.GET.{jobs_stream}",
        f"$JS.API.STREAM.MSG.GET.{jobs_stream}",
    ):
        assert await evil.send(subject, json.dumps({"last_by_subj": JOB}).encode()), subject

    # What the scheduler tells it about the job: that it is not evil's, and nothing else.
    status = await evil.ask(S.worker_attempt("evil"), {"job_id": JOB, "attempt": 1})
    assert status["ok"], status
    assert status["result"] == {
        "job_id": JOB,
        "attempt": 1,
        "holds": False,
        "state": None,
        "cancel_requested": False,
        "release_requested": False,
    }
    assert await evil.send(S.worker_attempt("honest"))

    # Training sessions: it may not lease or release a worker's room, call a session, hear
    # another worker's session calls, or read the leases; of a session's lease, the scheduler
    # tells it only that it holds none, and the registry grants it no store access for it.
    session = "tsess-0123456789abcdef-train-0"
    for subject in (
        S.scheduler("sessions.place"),
        S.scheduler("sessions.release"),
        S.worker_session("honest", session),
        f"$JS.API.DIRECT.GET.KV_{S.bucket('session_leases')}",
    ):
        assert await evil.send(subject), subject
    for subject in (S.worker_session("honest"), f"$KV.{S.bucket('session_leases')}.>"):
        assert await evil.listen(subject), subject
    status = await evil.ask(S.worker_attempt("evil"), {"job_id": session, "attempt": 1})
    assert status["result"]["holds"] is False, status
    saved = f"tinker/{TENANT}/{session}/state/step-000001/adapter_model.safetensors"
    grant = {"job_id": session, "attempt": 1, "attempt_token": "guessed", "op": "get", "key": saved}
    reply = await evil.ask(S.worker_registry("store.access", "evil"), grant)
    assert reply["code"] == "forbidden", reply

    await asyncio.sleep(1.0)  # the honest job keeps talking meanwhile: evil hears none of it
    assert evil.heard == []
    assert "Violation" in server_log(stack)


async def test_the_honest_job_succeeded_once_and_nobody_saw_a_forgery(stack: Stack) -> None:
    """Beside it all, the honest provider's job ran to its end, once, with one adapter
    version; the public events stream (what the gateway's SSE, telemetry and sweeps read)
    carries the honest run's events only; and every violation the server logged was evil's:
    the honest agent's whole job (its assignment, store grants, checkpoints, registration,
    events) needed none."""
    record = await stack.done
    assert record.state == JobState.succeeded, record
    assert "FORGED" not in (record.reason or "")
    assert record.adapter is not None
    assert record.adapter.version == 1
    # Nobody following the job saw a forged event: the public stream has the honest run's.
    public = await stack.scheduler.jetstream().subscribe(
        S.job_event(JOB, "*"), ordered_consumer=True
    )
    seen: list[tuple[str, dict[str, Any]]] = []
    with contextlib.suppress(nats.errors.TimeoutError):
        while True:
            msg = await public.next_msg(timeout=1)
            seen.append((msg.subject.rsplit(".", 1)[1], json.loads(msg.data)["data"]))
    await public.unsubscribe()
    names = [name for name, _ in seen]
    assert "failed" not in names, names
    assert names.count("succeeded") == 1, names
    assert all("FORGED" not in json.dumps(data) for _, data in seen)
    succeeded = next(data for name, data in seen if name == "succeeded")
    assert succeeded["adapter"]["version"] == 1

    honest_key = stack.creds["honest"].public_key
    violations = [ln for ln in server_log(stack).splitlines() if "Violation" in ln]
    assert violations  # the probes above
    assert not [ln for ln in violations if honest_key in ln], violations


async def test_a_session_on_the_honest_providers_worker_trains_by_its_grants_alone(
    stack: Stack, evil: Evil
) -> None:
    """Sessions on providers (``SWARM_SESSIONS_ON_PROVIDERS``): the gateway leases the honest
    worker's room and sends the session's calls, the worker reads the base model and writes
    the session's save through the registry's grants for the lease's attempt; evil, holding the
    attempt's token (stolen), is granted nothing, and hears none of the calls."""
    await stack.done  # the worker's one CPU is free again
    session, token = "tsess-00000000000000a1-train-0", "the-lease-attempts-token"
    base = await ask(stack.gateway, S.registry("models.get"), {"name": "tiny-llama"})
    place = {
        "session": session,
        "tenant": TENANT,
        "base_model": {k: base[k] for k in ("name", "version", "store_key", "digest")},
        "attempt_token_sha256": token_digest(token),
    }
    lease = SessionLease.model_validate(
        await ask(stack.gateway, S.scheduler("sessions.place"), place)
    )
    assert (lease.worker_id, lease.attempt) == ("honest", 1)

    def call(seq_id: int, op: str, **fields: Any) -> dict[str, Any]:
        return {"session": session, "tenant": TENANT, "seq_id": seq_id, "op": op} | fields

    calls = S.worker_session("honest", session)
    create = {"base_model": place["base_model"], "rank": 2, "seed": 0}
    info = await ask(stack.gateway, calls, call(0, "create", create=create, attempt_token=token))
    assert info["model_info"]["max_context"], info
    datum = {"tokens": [3, 4, 5], "inputs": {"target_tokens": [4, 5, 6], "weights": [1, 1, 1]}}
    fb = call(1, "forward_backward", data=[datum], loss_fn="cross_entropy")
    assert (await ask(stack.gateway, calls, fb))["metrics"]["loss:sum"] > 0
    key = f"tinker/{TENANT}/{session}/state/step-000000"
    saved = await ask(stack.gateway, calls, call(2, "save_state", store_key=key))
    assert saved["store_key"] == key
    assert "adapter_model.safetensors" in saved["files"]
    assert stack.store.exists(f"{key}/adapter_model.safetensors")

    grant = {"job_id": session, "attempt": 1, "attempt_token": token, "op": "get", "key": key}
    reply = await evil.ask(S.worker_registry("store.access", "evil"), grant)
    assert reply["code"] == "forbidden", reply
    assert "not held by worker 'evil'" in reply["error"]
    assert evil.heard == []


async def ask(nc: nats.NATS, subject: str, body: dict[str, Any]) -> Any:
    """A request as the connection's user; the reply's result (it must be ok)."""
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=60)
    reply = json.loads(msg.data)
    assert reply["ok"], reply
    return reply["result"]

"""Providers on a real nats-server with the shipped config plus two providers added by
``swarm providers add``: each is held to its own worker's subjects, and the scheduler applies
a job event only from the worker that holds the job's current attempt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import ConsumerConfig

from swarm.providers import add_provider, list_providers, remove_provider
from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.envelope import envelope
from swarm_contracts.events import Failed, Started
from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.layout import dataset_key
from swarm_contracts.providers import (
    ATTEMPT_TOKEN_HEADER,
    ProviderCredentials,
    consumer_name,
    read_credentials,
)
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Assignment, Heartbeat, Resources, WorkerInfo
from swarm_runtime.records import RecordTable
from swarm_runtime.store import ObjectStore, open_store
from swarm_trainer.settings import TrainerSettings

from ..scheduler.conftest import wait_record, write_fake_model
from .test_nats_permissions import as_service, connect, run_nats, shipped_config

S = Subjects()


class Providers:
    def __init__(self, url: str, conf: Path, creds: dict[str, ProviderCredentials]) -> None:
        self.url, self.conf, self.creds = url, conf, creds

    async def connect(self, name: str) -> tuple[nats.NATS, list[str]]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(
            self.url,
            nkeys_seed_str=self.creds[name].nkey_seed,
            error_cb=on_error,
            allow_reconnect=False,
            # A provider may subscribe under its own inbox prefix only.
            inbox_prefix=Subjects.worker_inbox(name),
        )
        return nc, errors


@pytest.fixture(scope="module")
def providers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Providers]:
    tmp = tmp_path_factory.mktemp("providers")
    conf = shipped_config(tmp)
    creds = {}
    for name in ("a", "b", "gone"):
        path, creds[name] = add_provider(conf, tmp / "creds", name, None, S)
        assert path.stat().st_mode & 0o777 == 0o600
        assert read_credentials(path) == creds[name]
    assert remove_provider(conf, tmp / "creds", "gone", S)
    assert [p.name for p in list_providers(conf)] == ["a", "b"]
    for url in run_nats(conf):
        yield Providers(url, conf, creds)


async def violated(errors: list[str], what: str, subject: str, wait_s: float = 10.0) -> bool:
    """Whether the server refused ``what`` on ``subject``: its -ERR arrives asynchronously,
    seconds later on a loaded machine, so it is waited for (every use expects a refusal)."""
    expected = f'permissions violation for {what} to "{subject.lower()}"'
    deadline = asyncio.get_running_loop().time() + wait_s
    while expected not in " ".join(errors):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_removed_provider_is_refused(providers: Providers) -> None:
    nc, _ = await providers.connect("a")  # the same server lets a current provider in
    await nc.close()
    with pytest.raises(nats.errors.Error):
        await providers.connect("gone")


async def test_provider_uses_only_its_own_worker_subjects(providers: Providers) -> None:
    a, errors = await providers.connect("a")
    js = a.jetstream()
    try:
        # Its own: heartbeats out, assignments, cancels and hand-backs in.
        await a.publish(S.heartbeat("a"), b"{}")
        for subject in (S.assign("a"), S.worker_cancel("a"), S.release("a")):
            await a.subscribe(subject)
        await a.flush()
        await asyncio.sleep(0.2)
        assert errors == []

        # Another worker's assignments: neither the subject nor a consumer of the stream.
        await a.subscribe(S.assign("b"))
        assert await violated(errors, "subscription", S.assign("b"))
        for name in (consumer_name("a"), consumer_name("b")):
            with pytest.raises(nats.errors.TimeoutError):
                await js.add_consumer(
                    S.assign_stream,
                    ConsumerConfig(name=name, durable_name=name, filter_subject=S.assign("b")),
                    timeout=1,
                )
        with pytest.raises(nats.errors.TimeoutError):  # the legacy form names no filter
            await js.add_consumer(
                S.assign_stream, ConsumerConfig(durable_name=consumer_name("a")), timeout=1
            )
        # Nor every job's events or cancels, nor another worker's cancels, nor anyone's
        # inbox but its own.
        for subject in (
            S.job_event(),
            S.cancel(),
            S.worker_cancel("b"),
            "_INBOX.>",
            f"{Subjects.worker_inbox('b')}.>",
            f"{Subjects.service_inbox('scheduler')}.>",
        ):
            await a.subscribe(subject)
            assert await violated(errors, "subscription", subject)
        # It cannot speak for another worker, submit, write a bucket or manage streams.
        for subject in (
            S.heartbeat("b"),
            S.worker_event("b", "job-1", "failed"),
            S.worker_registry("store.access", "b"),
            S.job_event("job-1", "failed"),
            S.assign("a"),
            S.submit,
            "$KV.swarm_jobs.job-1",
            f"$JS.API.STREAM.DELETE.{S.assign_stream}",
            f"$JS.API.STREAM.MSG.GET.KV_{S.bucket('jobs')}",
        ):
            await a.publish(subject, b"{}")
            assert await violated(errors, "publish", subject), subject
    finally:
        await a.close()


Submit = Callable[[str], Awaitable[None]]


async def add_dataset(gateway: nats.NATS, sha: str, size: int) -> DatasetInfo:
    """A text dataset of tenant ``default`` in the datasets bucket, as the gateway adds one."""
    info = DatasetInfo(
        id=dataset_id_for(sha),
        tenant="default",
        sha256=sha,
        store_key=dataset_key("default", sha),
        format="text",
        examples=1,
        bytes=size,
    )
    kv = await gateway.jetstream().key_value(S.bucket("datasets"))
    await kv.put(f"default.{info.id}", info.model_dump_json().encode())
    return info


async def register_tiny_model(gateway: nats.NATS, store: ObjectStore, tmp_path: Path) -> None:
    """A fake base model ``tiny`` in the store, registered as the gateway registers one."""
    write_fake_model(tmp_path / "model")
    await asyncio.to_thread(store.upload_dir, tmp_path / "model", "models/tiny/x")
    reply = await gateway.request(
        S.registry("models.register"),
        json.dumps({"name": "tiny", "store_key": "models/tiny/x"}).encode(),
        timeout=10,
    )
    assert json.loads(reply.data)["ok"], reply.data


@pytest.fixture
async def cluster(providers: Providers, tmp_path: Path) -> AsyncIterator[Submit]:
    """The registry and the scheduler as their own users, a model and a dataset; submits a
    job with the given id."""
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler

    settings = as_service(providers.url, "scheduler", tmp_path)
    gateway, _ = await connect(providers.url, "gateway")
    try:
        async with (
            build_registry(as_service(providers.url, "registry", tmp_path)),
            build_scheduler(settings),
        ):
            await register_tiny_model(gateway, open_store(settings), tmp_path)
            info = await add_dataset(gateway, "cd" * 32, 30)

            async def submit(job_id: str) -> None:
                event = {"specversion": "1.0", "id": job_id, "source": "test", "type": "submit"}
                event["data"] = {  # type: ignore[assignment]
                    "job_id": job_id,
                    "spec": {"name": "bot", "base_model": "tiny", "dataset": info.id},
                }
                await gateway.jetstream().publish(S.submit, json.dumps(event).encode())

            yield submit
    finally:
        await gateway.close()


async def test_provider_answers_only_its_own_benchmark_requests(providers: Providers) -> None:
    a, errors = await providers.connect("a")
    gateway, gateway_errors = await connect(providers.url, "gateway")

    async def measure(msg: nats.aio.msg.Msg) -> None:
        await a.publish(msg.reply, b'{"ok": true}')

    try:
        # `swarm workers benchmark a`: the gateway asks, the provider answers on its inbox.
        await a.subscribe(S.benchmark("a"), cb=measure)
        await a.flush()
        reply = await gateway.request(S.benchmark("a"), b"{}", timeout=30)
        assert json.loads(reply.data) == {"ok": True}
        assert errors == []
        assert gateway_errors == []
        # Another worker's requests are not its to hear.
        await a.subscribe(S.benchmark("b"))
        assert await violated(errors, "subscription", S.benchmark("b"))
    finally:
        await a.close()
        await gateway.close()


async def test_scheduler_applies_events_only_from_the_attempts_worker(
    providers: Providers, cluster: Submit
) -> None:
    job_id = "job-0123456789abcdef"
    await cluster(job_id)
    scheduler, _ = await connect(providers.url, "scheduler")
    a, a_errors = await providers.connect("a")
    b, b_errors = await providers.connect("b")
    try:
        jobs = RecordTable(await scheduler.jetstream().key_value(S.bucket("jobs")), JobRecord)
        res = Resources(cpus=4, memory_bytes=8 << 30)
        beat = Heartbeat(worker_id="b", resources=res, free=res, provider="b")
        await b.publish(
            S.heartbeat("b"), envelope("trainer", "hb", beat).model_dump_json().encode()
        )
        record = await wait_record(jobs, job_id, lambda r: r.state == JobState.assigned)
        assert (record.worker_id, record.attempt) == ("b", 1)

        # Provider a reports on b's attempt, on its own subject (the only one it may use):
        # with no token, with a made-up one. None of it reaches the job record.
        for headers in ({}, {ATTEMPT_TOKEN_HEADER: "guessed"}):
            for event in (
                Started(job_id=job_id, attempt=1, worker_id="a"),
                Failed(job_id=job_id, attempt=1, reason="forged"),
            ):
                await a.jetstream().publish(
                    S.worker_event("a", job_id, event.event),
                    envelope("trainer", event.event, event).model_dump_json().encode(),
                    headers=headers,
                )
        await asyncio.sleep(1.0)
        found = await jobs.get(job_id)
        assert found is not None
        assert (found[0].state, found[0].reason) == (JobState.assigned, None)

        # b takes its assignment through its own consumer; its event carries the token.
        sub = await b.jetstream().pull_subscribe(
            S.assign("b"), durable=consumer_name("b"), stream=S.assign_stream
        )
        msg = (await sub.fetch(1, timeout=5))[0]
        await msg.ack()
        assignment = Assignment.model_validate(json.loads(msg.data)["data"])
        assert assignment.attempt_token
        started = Started(job_id=job_id, attempt=1, worker_id="b")
        await b.jetstream().publish(
            S.worker_event("b", job_id, "started"),
            envelope("trainer", "started", started).model_dump_json().encode(),
            headers={ATTEMPT_TOKEN_HEADER: assignment.attempt_token},
        )
        await wait_record(jobs, job_id, lambda r: r.state == JobState.running)
        assert a_errors + b_errors == []  # all of the above was permitted
        # Only b's event reached the public events stream (the scheduler published it).
        public = await scheduler.jetstream().subscribe(
            S.job_event(job_id, "*"), ordered_consumer=True
        )
        seen = []
        with contextlib.suppress(nats.errors.TimeoutError):
            while True:
                msg = await public.next_msg(timeout=1)
                seen.append((msg.subject.rsplit(".", 1)[1], json.loads(msg.data)["data"]))
        await public.unsubscribe()
        assert [e for e, _ in seen] == ["queued", "assigned", "started"]
        assert seen[-1][1]["worker_id"] == "b"
    finally:
        for nc in (scheduler, a, b):
            await nc.close()


async def test_a_providers_agent_joins_and_reports_on_its_job(
    providers: Providers, cluster: Submit, tmp_path: Path
) -> None:
    """The real agent, started as ``swarm-trainer join`` starts it, does all its work within
    provider a's permissions: it shows up as worker a of provider a, takes the job placed on
    it from its own consumer, checks the record, and its events (here: the fake model cannot
    be trained) change the job record."""
    from swarm_trainer.app import build_app

    creds = tmp_path / "a.creds.json"
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(providers.creds["a"].model_dump_json())
    log = providers.conf.with_suffix(".log")
    seen = log.stat().st_size
    settings = TrainerSettings(
        nats_url=providers.url,
        provider_creds_file=creds,
        worker_id="ignored",  # the credentials name the worker
        store_url=(tmp_path / "store").as_uri(),
        work_dir=tmp_path / "work",
        heartbeat_interval_s=0.5,
        trainer_cpus=1,
    )
    scheduler, _ = await connect(providers.url, "scheduler")
    job_id = "job-00000000000000a1"
    try:
        js = scheduler.jetstream()
        jobs = RecordTable(await js.key_value(S.bucket("jobs")), JobRecord)
        async with build_app(settings):
            await cluster(job_id)
            record = await wait_record(jobs, job_id, lambda r: r.state.terminal, timeout=60)
            workers = await js.key_value(S.bucket("workers"))
            worker = WorkerInfo.model_validate_json((await workers.get("a")).value or b"")
        assert (record.worker_id, record.state) == ("a", JobState.failed), record
        # The agent's own report (its preflight found no dataset), with its attempt's token.
        assert "missing in the store" in (record.reason or ""), record.reason
        assert worker.provider == "a"
        # Nothing the agent did was refused (the server logs every permissions violation).
        with log.open() as f:
            f.seek(seen)
            assert "violation" not in f.read().lower()
    finally:
        await scheduler.close()

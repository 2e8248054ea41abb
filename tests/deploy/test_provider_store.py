"""A provider's worker holds no store keys: what it reads comes through the registry's signer,
and its credentials (its nkey user and its assignments' attempt tokens) do not fetch a dataset
it was not assigned. Real nats-server with the shipped config and ``swarm providers add``,
the real registry and scheduler as their own users, a real S3 server."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from pydantic import SecretStr

from swarm_contracts.envelope import envelope
from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.providers import consumer_name
from swarm_contracts.workers import Assignment, Heartbeat, Resources
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.signed_store import SignedAccess, SignedStore, StoreAccessRefused

from ..conftest import S3Server
from ..scheduler.conftest import wait_record
from .test_nats_permissions import as_service, connect
from .test_providers import (  # the module's fixture, too
    Providers,
    S,
    add_dataset,
    providers,  # noqa: F401
    register_tiny_model,
)


@dataclass
class Placed:
    assignments: dict[str, Assignment]  # provider -> the assignment it took
    datasets: dict[str, str]  # job id -> its dataset's key


def with_s3(settings: Settings, server: S3Server, bucket: str) -> Settings:
    return settings.model_copy(
        update={
            "store_url": f"s3://{bucket}?endpoint={server.endpoint}",
            "s3_access_key": server.access_key,
            "s3_secret_key": SecretStr(server.secret_key),
        }
    )


@pytest.fixture
async def placed(
    providers: Providers,  # noqa: F811
    s3_server: S3Server,
    tmp_path: Path,
) -> AsyncIterator[Placed]:
    """Job ``job-a…`` placed on provider a and ``job-b…`` on provider b, each on its own
    dataset; each provider took its assignment from its own consumer."""
    from swarm_registry.app import build_app as build_registry
    from swarm_scheduler.app import build_app as build_scheduler

    bucket = "providers-" + os.urandom(4).hex()
    registry = with_s3(as_service(providers.url, "registry", tmp_path), s3_server, bucket)
    scheduler = with_s3(as_service(providers.url, "scheduler", tmp_path), s3_server, bucket)
    store = open_store(registry)
    gateway, _ = await connect(providers.url, "gateway")
    a, _ = await providers.connect("a")
    b, _ = await providers.connect("b")
    try:
        async with build_registry(registry), build_scheduler(scheduler):
            await register_tiny_model(gateway, store, tmp_path)
            jobs = RecordTable(await gateway.jetstream().key_value(S.bucket("jobs")), JobRecord)
            datasets, assignments = {}, {}
            for name, nc in (("a", a), ("b", b)):
                job_id = f"job-{name * 16}"
                data = f'{{"text": "{name}\'s private data"}}\n'.encode()
                info = await add_dataset(gateway, name * 64, len(data))
                await asyncio.to_thread(store.put_bytes, info.store_key, data)
                datasets[job_id] = info.store_key
                # One CPU each: the provider heard from last is the only one with room.
                res = Resources(cpus=1, memory_bytes=8 << 30)
                beat = Heartbeat(worker_id=name, resources=res, free=res, provider=name)
                await nc.publish(
                    S.heartbeat(name), envelope("trainer", "hb", beat).model_dump_json().encode()
                )
                event = {"specversion": "1.0", "id": job_id, "source": "test", "type": "submit"}
                event["data"] = {  # type: ignore[assignment]
                    "job_id": job_id,
                    "spec": {"name": "bot", "base_model": "tiny", "dataset": info.id},
                }
                await gateway.jetstream().publish(S.submit, json.dumps(event).encode())
                record = await wait_record(jobs, job_id, lambda r: r.state == JobState.assigned)
                assert record.worker_id == name
                sub = await nc.jetstream().pull_subscribe(
                    S.assign(name), durable=consumer_name(name), stream=S.assign_stream
                )
                msg = (await sub.fetch(1, timeout=5))[0]
                await msg.ack()
                assignments[name] = Assignment.model_validate(json.loads(msg.data)["data"])
            yield Placed(assignments, datasets)
    finally:
        for nc in (gateway, a, b):
            await nc.close()


def creds_file(providers: Providers, name: str, tmp_path: Path) -> Path:  # noqa: F811
    path = tmp_path / f"{name}.creds.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(providers.creds[name].model_dump_json())
    return path


async def test_a_provider_cannot_fetch_a_dataset_it_was_not_assigned(
    providers: Providers,  # noqa: F811
    placed: Placed,
    tmp_path: Path,
) -> None:
    # Provider a's worker as `swarm-trainer join` runs it: its join file, no store keys.
    worker = Settings(
        nats_url=providers.url, provider_creds_file=creds_file(providers, "a", tmp_path)
    )
    assert worker.s3_access_key is None
    assert worker.s3_secret_key is None
    mine = placed.assignments["a"]
    theirs = placed.assignments["b"]
    assert mine.attempt_token
    assert theirs.attempt_token
    own_dataset = placed.datasets[mine.job_id]
    their_dataset = placed.datasets[theirs.job_id]
    log = providers.conf.with_suffix(".log")
    seen = log.stat().st_size

    def as_a(job: Assignment, token: str) -> SignedStore:
        access = SignedAccess(
            nats=worker,
            job_id=job.job_id,
            attempt=job.attempt,
            attempt_token=SecretStr(token),
            worker_id="a",  # a asks on its own subject: NATS lets it use no other
        )
        return SignedStore(access)

    def fetch() -> None:
        own = as_a(mine, mine.attempt_token or "")
        # Its own job's dataset and base model come through, over its own NATS user.
        assert own.get_bytes(own_dataset) == b'{"text": "a\'s private data"}\n'
        assert own.list("models/tiny/x/") == [
            "models/tiny/x/config.json",
            "models/tiny/x/model.safetensors",
        ]
        # b's dataset: not with a's grant, nor by naming b's job (a guessed token, a's own
        # token, none), nor by listing around it.
        attempts = [
            lambda: own.get_bytes(their_dataset),
            lambda: own.get_file(their_dataset, tmp_path / "stolen"),
            lambda: own.list("datasets/default/"),
            lambda: as_a(theirs, "guessed").get_bytes(their_dataset),
            lambda: as_a(theirs, mine.attempt_token or "").get_bytes(their_dataset),
            lambda: as_a(theirs, "").get_bytes(their_dataset),
            # Even with b's own token (sniffed, say): the attempt is not a's.
            lambda: as_a(theirs, theirs.attempt_token or "").get_bytes(their_dataset),
        ]
        for attempt in attempts:
            with pytest.raises(StoreAccessRefused) as refused:
                attempt()
            assert refused.value.code == "forbidden"

    await asyncio.to_thread(fetch)
    assert not (tmp_path / "stolen").exists()
    # Asking the signer is within a's permissions; the other registry subjects are not.
    with log.open() as f:
        f.seek(seen)
        assert "violation" not in f.read().lower()
    nc = await nats.connect(providers.url, nkeys_seed_str=providers.creds["a"].nkey_seed)
    try:
        with pytest.raises(nats.errors.Error):
            await nc.request(S.registry("models.list"), b"{}", timeout=2)
    finally:
        await nc.close()


def test_join_holds_no_store_keys_unless_given(
    providers: Providers,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swarm_trainer.app import join_settings

    creds = creds_file(providers, "a", tmp_path)
    for name in ("SWARM_STORE_ACCESS", "SWARM_S3_ACCESS_KEY", "SWARM_S3_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert join_settings(TrainerSettings(), creds).store_access == "signed"
    # A provider the admin gave keys (or told otherwise) keeps them, as before.
    monkeypatch.setenv("SWARM_S3_ACCESS_KEY", "k")
    assert join_settings(TrainerSettings(), creds).store_access == "keys"
    monkeypatch.delenv("SWARM_S3_ACCESS_KEY")
    monkeypatch.setenv("SWARM_STORE_ACCESS", "keys")
    assert join_settings(TrainerSettings(), creds).store_access == "keys"
    monkeypatch.delenv("SWARM_STORE_ACCESS")
    joined = join_settings(TrainerSettings(), creds, "nats://elsewhere:4222")
    assert (joined.nats_url, joined.provider_creds_file) == ("nats://elsewhere:4222", creds)


def test_join_with_a_relative_creds_path_works_from_any_directory(
    providers: Providers,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``swarm-trainer join --creds acme.creds.json``: the agent's Ray processes (another
    working directory) open the file too, so the path they get is absolute."""
    from swarm_trainer.app import join_settings

    creds = creds_file(providers, "a", tmp_path)
    monkeypatch.chdir(creds.parent)
    joined = join_settings(TrainerSettings(), Path(creds.name))
    assert joined.provider_creds_file == creds
    assert joined.provider_creds_file.is_absolute()
    # The same file named through the environment (SWARM_PROVIDER_CREDS_FILE) and for NATS.
    monkeypatch.setenv("SWARM_PROVIDER_CREDS_FILE", creds.name)
    monkeypatch.setenv("SWARM_NATS_CREDS_FILE", "nats.creds")
    from_env = Settings()
    assert from_env.provider_creds_file == creds
    assert from_env.nats_creds_file == creds.parent / "nats.creds"

"""OpenAI's Files and fine-tuning jobs API, driven by the stock ``openai`` client against the
real gateway and nats-server; the registry and scheduler are played by the test (a registry
that knows ``tiny@1`` and alice's adapter ``bot@1``, a scheduler that records submissions and
whose events the test reports).

Long because: its tests all drive one API through the same played registry and scheduler.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta

import httpx
import nats
import openai
import pytest
from fastapi import FastAPI

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.events import (
    CancelRequest,
    CheckpointSaved,
    PauseRequest,
    Progress,
    ResumeRequest,
    Started,
    Succeeded,
    Validated,
)
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState, LoraSpec, TrainingSpec
from swarm_contracts.registry import (
    AdapterVersion,
    GetAdapter,
    GetModel,
    Lineage,
    ModelVersion,
)
from swarm_contracts.replies import Reply
from swarm_contracts.subjects import Subjects
from swarm_runtime.broker import make_broker, publish_job_event
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings

from .conftest import make_app
from .test_jobs import fake_scheduler

CHAT = "".join(
    json.dumps(
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": str(2 * i), "weight": 1},
            ]
        }
    )
    + "\n"
    for i in range(10)
).encode()


def model(version: int) -> ModelVersion:
    return ModelVersion(
        name="tiny",
        version=version,
        store_key=f"models/tiny/{version}",
        files={},
        digest="d",
        architecture="LlamaForCausalLM",
        parameter_count=1000,
        tokenizer=True,
    )


def adapter(version: int) -> AdapterVersion:
    lineage = Lineage(
        tenant="alice",
        job_id="job-00000000000000000001",
        attempt=1,
        base_model="tiny",
        base_model_version=1,
        base_model_digest="d",
        dataset="ds-" + "0" * 24,
        dataset_digest="d",
        lora=LoraSpec(),
        training=TrainingSpec(),
    )
    return AdapterVersion(
        name="bot", version=version, tenant="alice", store_key="a", files={}, lineage=lineage
    )


async def fake_registry(settings: Settings) -> nats.NATS:
    """``tiny`` (versions 1 and 2) and alice's adapter ``bot`` (versions 1 and 2, alias
    ``prod`` -> 1)."""
    nc = await nats.connect(settings.nats_url)
    subjects = Subjects(settings.namespace)

    async def answer(msg: nats.aio.msg.Msg, result: object) -> None:
        if result is None:
            reply: Reply = Reply(ok=False, code="not_found", error="not found")
        else:
            reply = Reply(ok=True, result=result)
        await msg.respond(reply.model_dump_json().encode())

    async def models_get(msg: nats.aio.msg.Msg) -> None:
        request = GetModel.model_validate_json(msg.data)
        known = request.name == "tiny" and request.version in (None, 1, 2)
        await answer(msg, model(request.version or 2) if known else None)

    async def adapters_get(msg: nats.aio.msg.Msg) -> None:
        request = GetAdapter.model_validate_json(msg.data)
        name, _, tail = request.name.partition("@")
        version = {"": 2, "1": 1, "2": 2, "prod": 1}.get(tail)
        await answer(msg, adapter(version) if name == "bot" and version else None)

    async def models_list(msg: nats.aio.msg.Msg) -> None:
        await answer(msg, [model(1), model(2)])

    async def adapters_list(msg: nats.aio.msg.Msg) -> None:
        await answer(msg, [adapter(1), adapter(2)])

    for name, cb in (
        ("models.get", models_get),
        ("adapters.get", adapters_get),
        ("models.list", models_list),
        ("adapters.list", adapters_list),
    ):
        await nc.subscribe(subjects.registry(name), cb=cb)
    return nc


@dataclass
class Env:
    alice: openai.AsyncOpenAI
    bob: openai.AsyncOpenAI
    http: httpx.AsyncClient  # alice's, for Swarm's own API
    jobs: RecordTable[JobRecord]
    settings: Settings


def stock_client(app: FastAPI, key: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw/v1")
    return openai.AsyncOpenAI(api_key=key, base_url="http://gw/v1", http_client=http, max_retries=0)


@pytest.fixture
async def env(auth_settings: Settings) -> AsyncIterator[Env]:
    app = make_app(auth_settings)
    async with (
        app.router.lifespan_context(app),  # makes the streams the fakes consume
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://gw",
            headers={"Authorization": "Bearer ka"},
        ) as http,
    ):
        registry = await fake_registry(auth_settings)
        scheduler, jobs = await fake_scheduler(auth_settings)
        try:
            yield Env(stock_client(app, "ka"), stock_client(app, "kb"), http, jobs, auth_settings)
        finally:
            await scheduler.close()
            await registry.close()


async def upload(client: openai.AsyncOpenAI, data: bytes = CHAT) -> str:
    return (await client.files.create(file=("train.jsonl", data), purpose="fine-tune")).id


async def test_files_are_datasets_of_the_tenant(env: Env) -> None:
    created = await env.alice.files.create(file=("train.jsonl", CHAT), purpose="fine-tune")
    assert created.id.startswith("file-")
    assert (created.bytes, created.filename, created.purpose) == (
        len(CHAT),
        "train.jsonl",
        "fine-tune",
    )
    assert created.status == "processed"
    # The same dataset underneath, in Swarm's own API.
    ds = (await env.http.get(f"/v1/datasets/ds-{created.id.removeprefix('file-')}")).json()
    assert (ds["format"], ds["examples"]) == ("chat", 10)

    assert [f.id for f in (await env.alice.files.list()).data] == [created.id]
    assert (await env.alice.files.retrieve(created.id)).bytes == len(CHAT)
    assert (await env.alice.files.content(created.id)).read() == CHAT
    # Bob sees nothing of alice's.
    assert (await env.bob.files.list()).data == []
    with pytest.raises(openai.NotFoundError):
        await env.bob.files.retrieve(created.id)

    deleted = await env.alice.files.delete(created.id)
    assert deleted.deleted
    assert deleted.id == created.id
    with pytest.raises(openai.NotFoundError) as missing:
        await env.alice.files.retrieve(created.id)
    assert missing.value.code == "file_not_found"


async def test_a_bad_file_is_a_400_naming_the_line(env: Env) -> None:
    bad = CHAT + b'{"messages": [{"role": "user"}]}\n'
    with pytest.raises(openai.BadRequestError) as refused:
        await env.alice.files.create(file=("bad.jsonl", bad), purpose="fine-tune")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "file"
    assert error["code"] == "invalid_file_format"
    assert "line 11" in error["message"]
    with pytest.raises(openai.BadRequestError) as purpose:
        await env.alice.files.create(file=("a.jsonl", CHAT), purpose="assistants")
    assert purpose.value.code == "unsupported_purpose"


async def test_create_resolves_auto_and_submits_a_swarm_job(env: Env) -> None:
    file = await upload(env.alice)
    job = await env.alice.fine_tuning.jobs.create(
        model="tiny",
        training_file=file,
        suffix="Support Bot",
        seed=7,
        metadata={"team": "support"},
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
    )
    assert job.id.startswith("ftjob-")
    assert job.status == "queued"
    assert job.model == "tiny"
    assert job.training_file == file
    assert job.seed == 7
    assert job.organization_id == "alice"
    assert job.metadata == {"team": "support"}
    assert job.fine_tuned_model is None
    assert job.result_files == []
    hyper = job.hyperparameters
    assert (hyper.n_epochs, hyper.batch_size, hyper.learning_rate_multiplier) == (2, 8, 1.0)
    assert job.method is not None
    assert job.method.type == "supervised"

    # One job system: the Swarm job, with the hyperparameters as Swarm settings.
    swarm = (await env.http.get(f"/v1/jobs/job-{job.id.removeprefix('ftjob-')}")).json()
    spec = swarm["spec"]
    assert spec["name"] == "support-bot"
    assert spec["base_model"] == "tiny@2"
    assert spec["training"]["max_steps"] == 2 * math.ceil(10 / 8)
    assert spec["training"]["checkpoint_every"] == math.ceil(10 / 8)
    assert spec["training"]["seed"] == 7
    assert spec["training"]["val_fraction"] == 0.0

    legacy = await env.alice.fine_tuning.jobs.create(
        model="bot@1",  # fine-tuning a fine-tuned model continues its adapter
        training_file=file,
        validation_file=file,
        hyperparameters={"batch_size": 5, "learning_rate_multiplier": 0.5},
        extra_body={"swarm": {"lora": {"r": 4}, "resources": {"cpus_per_worker": 2}}},
    )
    hyper = legacy.hyperparameters
    assert (hyper.n_epochs, hyper.batch_size, hyper.learning_rate_multiplier) == (3, 5, 0.5)
    swarm = (await env.http.get(f"/v1/jobs/{legacy.model_extra['swarm_job_id']}")).json()  # type: ignore[index]
    assert swarm["spec"]["from_adapter"] == "bot@1"
    assert swarm["spec"]["base_model"] == "tiny@1"
    assert swarm["spec"]["validation"] == swarm["spec"]["dataset"]
    assert swarm["spec"]["lora"]["r"] == 4
    assert swarm["spec"]["resources"]["cpus_per_worker"] == 2
    assert swarm["spec"]["training"]["lr"] == pytest.approx(1e-4)


PAIRS = "".join(
    json.dumps(
        {
            "input": {"messages": [{"role": "user", "content": f"What is {i} + {i}?"}]},
            "preferred_output": [{"role": "assistant", "content": str(2 * i)}],
            "non_preferred_output": [{"role": "assistant", "content": str(2 * i + 1)}],
        }
    )
    + "\n"
    for i in range(10)
).encode()


async def test_a_dpo_job_is_a_swarm_dpo_job(env: Env) -> None:
    """OpenAI's DPO method (the stock client's ``method.dpo.hyperparameters``) becomes the
    Swarm spec's ``method``; its preference file is checked line by line, and a supervised
    job on it (or a DPO job on a supervised file) is refused naming the file."""
    pairs = await upload(env.alice, PAIRS)
    ds = (await env.http.get(f"/v1/datasets/ds-{pairs.removeprefix('file-')}")).json()
    assert (ds["format"], ds["examples"]) == ("preference_openai", 10)
    job = await env.alice.fine_tuning.jobs.create(
        model="tiny",
        training_file=pairs,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.25, "n_epochs": 1}}},
    )
    assert job.method is not None
    assert job.method.dpo is not None
    assert job.method.type == "dpo"
    assert job.method.supervised is None
    hyper = job.method.dpo.hyperparameters
    assert hyper is not None
    assert (hyper.beta, hyper.n_epochs, hyper.batch_size) == (0.25, 1, 8)
    swarm = (await env.http.get(f"/v1/jobs/job-{job.id.removeprefix('ftjob-')}")).json()
    assert swarm["spec"]["method"] == {"type": "dpo", "beta": 0.25}
    assert swarm["spec"]["training"]["max_steps"] == math.ceil(10 / 8)
    auto = await env.alice.fine_tuning.jobs.create(
        model="tiny", training_file=pairs, method={"type": "dpo"}
    )
    assert auto.method is not None
    assert auto.method.dpo is not None
    assert auto.method.dpo.hyperparameters is not None
    assert auto.method.dpo.hyperparameters.beta == 0.1  # "auto"
    retrieved = await env.alice.fine_tuning.jobs.retrieve(job.id)
    assert retrieved.method is not None
    assert retrieved.method.type == "dpo"

    refusals = [
        ({"training_file": pairs}, "training_file", "invalid_training_file"),
        (
            {
                "training_file": pairs,
                "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0}}},
            },
            "method.dpo.hyperparameters.beta",
            "invalid_value",
        ),
        (
            {"training_file": pairs, "method": {"type": "dpo", "supervised": {}}},
            "method.supervised",
            "invalid_value",
        ),
    ]
    for create, param, code in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            await env.alice.fine_tuning.jobs.create(model="tiny", **create)  # type: ignore[arg-type]
        assert (refused.value.body["param"], refused.value.code) == (param, code), create  # type: ignore[index]
    # A pair with an answer that is not the assistant's: the line is named.
    bad = (
        PAIRS
        + json.dumps(
            {
                "input": {"messages": [{"role": "user", "content": "hi"}]},
                "preferred_output": [{"role": "user", "content": "x"}],
                "non_preferred_output": [{"role": "assistant", "content": "y"}],
            }
        ).encode()
        + b"\n"
    )
    with pytest.raises(openai.BadRequestError) as refused:
        await env.alice.files.create(file=("bad.jsonl", bad), purpose="fine-tune")
    assert "line 11: 'preferred_output' must end with an assistant message" in str(
        refused.value.body
    )


BAD_CREATES = [
    ({"model": "nope"}, "model", "model_not_available"),
    ({"training_file": "file-000000000000000000000000"}, "training_file", "invalid_file"),
    ({"hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs", "invalid_value"),
    ({"hyperparameters": {"batch_size": "big"}}, "hyperparameters.batch_size", "invalid_value"),
    (
        {"method": {"type": "supervised", "supervised": {"hyperparameters": {"beta": 1}}}},
        "method.supervised.hyperparameters.beta",
        "invalid_value",
    ),
    (
        {
            "hyperparameters": {"n_epochs": 1},
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
        },
        "hyperparameters",
        "invalid_value",
    ),
    ({"method": {"type": "reinforcement"}}, "method.type", "unsupported_method"),
    # A DPO job on a supervised file: the file is named.
    ({"method": {"type": "dpo"}}, "training_file", "invalid_training_file"),
    ({"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 65, "invalid_value"),
    ({"extra_body": {"epochs": 3}}, "epochs", "invalid_value"),
    ({"extra_body": {"swarm": {"training": {"lr": 5}}}}, "swarm.training.lr", "invalid_value"),
    ({"extra_body": {"swarm": {"name": "x"}}}, "swarm.name", "invalid_value"),
]


async def test_bad_requests_are_openai_400s(env: Env) -> None:
    # One test for all (each gateway's first request builds its OpenAPI document: seconds).
    file = await upload(env.alice)
    for create, param, code in BAD_CREATES:
        body = {"model": "tiny", "training_file": file} | create
        with pytest.raises(openai.BadRequestError) as refused:
            await env.alice.fine_tuning.jobs.create(**body)
        error = refused.value.body
        assert isinstance(error, dict), create
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["param"], error["code"], error["type"]) == (
            param,
            code,
            "invalid_request_error",
        ), (create, error)
    assert (await env.alice.fine_tuning.jobs.list()).data == []  # nothing was submitted


async def test_other_tenants_and_bad_keys(env: Env, auth_settings: Settings) -> None:
    job = await env.alice.fine_tuning.jobs.create(
        model="tiny", training_file=await upload(env.alice)
    )
    with pytest.raises(openai.NotFoundError):
        await env.bob.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.NotFoundError):
        await env.bob.fine_tuning.jobs.cancel(job.id)
    with pytest.raises(openai.NotFoundError):
        await env.bob.fine_tuning.jobs.list_events(job.id)
    # Bob can neither train on alice's file.
    with pytest.raises(openai.BadRequestError):
        await env.bob.fine_tuning.jobs.create(model="tiny", training_file=job.training_file)
    assert (await env.bob.fine_tuning.jobs.list()).data == []

    # A method the path does not serve: OpenAI's shape too, with the Allow header.
    wrong_method = await env.http.put("/v1/fine_tuning/jobs")
    assert wrong_method.status_code == 405
    assert "GET" in wrong_method.headers["allow"]
    assert wrong_method.json()["error"]["message"]

    app = make_app(auth_settings)
    async with app.router.lifespan_context(app):
        wrong = stock_client(app, "no-such-key")
        for call in (wrong.fine_tuning.jobs.list(), wrong.files.list(), wrong.models.list()):
            with pytest.raises(openai.AuthenticationError) as denied:
                await call
            body = denied.value.body
            assert isinstance(body, dict)
            assert body["type"] == "authentication_error"


async def test_pause_resume_and_cancel(env: Env) -> None:
    job = await env.alice.fine_tuning.jobs.create(
        model="tiny", training_file=await upload(env.alice)
    )
    job_id = "job-" + job.id.removeprefix("ftjob-")
    # Queued: nothing to pause (only a running job can be), nothing to resume.
    with pytest.raises(openai.ConflictError) as queued:
        await env.alice.fine_tuning.jobs.pause(job.id)
    assert queued.value.code == "job_not_pausable"
    assert "queued, not running" in queued.value.message
    with pytest.raises(openai.ConflictError) as not_paused:
        await env.alice.fine_tuning.jobs.resume(job.id)
    assert not_paused.value.code == "job_not_resumable"
    # Another tenant's job is as unknown as a missing one.
    for call in (env.bob.fine_tuning.jobs.pause, env.bob.fine_tuning.jobs.resume):
        with pytest.raises(openai.NotFoundError):
            await call(job.id)

    def to(state: JobState) -> Callable[[JobRecord], JobRecord]:
        def change(record: JobRecord) -> JobRecord:
            record.state, record.worker_id = state, None if state == JobState.paused else "w1"
            return record

        return change

    nc = await nats.connect(env.settings.nats_url)
    try:
        subjects = Subjects(env.settings.namespace)
        js = nc.jetstream()

        async def asked(subject: str, model: type[PauseRequest | ResumeRequest]) -> str:
            sub = await js.subscribe(subject, ordered_consumer=True)
            msg = await sub.next_msg(5)
            await sub.unsubscribe()
            return CloudEvent[model].model_validate_json(msg.data).data.job_id  # type: ignore[valid-type]

        # Running: the pause goes to the scheduler; the job is shown running until its worker
        # has handed it back (the scheduler's part, played here).
        await env.jobs.modify(job_id, to(JobState.running))
        pausing = await env.alice.fine_tuning.jobs.pause(job.id)
        assert (pausing.id, pausing.status) == (job.id, "running")
        assert await asked(subjects.pause(job_id), PauseRequest) == job_id
        await env.jobs.modify(job_id, to(JobState.paused))
        assert (await env.alice.fine_tuning.jobs.retrieve(job.id)).status == "paused"
        with pytest.raises(openai.ConflictError, match="already paused"):
            await env.alice.fine_tuning.jobs.pause(job.id)
        resuming = await env.alice.fine_tuning.jobs.resume(job.id)
        assert resuming.status == "paused"  # until the scheduler has queued it again
        assert await asked(subjects.resume(job_id), ResumeRequest) == job_id

        sub = await js.subscribe(subjects.cancel(job_id), ordered_consumer=True)
        assert (await env.alice.fine_tuning.jobs.cancel(job.id)).id == job.id
        cancel = CloudEvent[CancelRequest].model_validate_json((await sub.next_msg(5)).data)
        assert cancel.data.job_id == job_id
    finally:
        await nc.close()

    def end(record: JobRecord) -> JobRecord:
        record.state = JobState.cancelled
        return record

    await env.jobs.modify(job_id, end)
    assert (await env.alice.fine_tuning.jobs.retrieve(job.id)).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        await env.alice.fine_tuning.jobs.cancel(job.id)
    with pytest.raises(openai.ConflictError, match="nothing to pause"):
        await env.alice.fine_tuning.jobs.pause(job.id)


async def test_list_pages_and_filters_by_metadata(env: Env) -> None:
    file = await upload(env.alice)
    ids = []
    for i in range(5):
        job = await env.alice.fine_tuning.jobs.create(
            model="tiny", training_file=file, metadata={"n": str(i), "parity": str(i % 2)}
        )
        ids.append(job.id)
    plain = await env.alice.fine_tuning.jobs.create(model="tiny", training_file=file)

    first = await env.alice.fine_tuning.jobs.list(limit=2)
    assert first.has_more
    assert len(first.data) == 2
    every = [j.id async for j in await env.alice.fine_tuning.jobs.list(limit=2)]
    assert sorted(every) == sorted([*ids, plain.id])
    assert len(every) == 6
    odd = await env.alice.fine_tuning.jobs.list(metadata={"parity": "1"})
    assert {j.id for j in odd.data} == {ids[1], ids[3]}
    none = await env.alice.fine_tuning.jobs.list(extra_query={"metadata": "null"})
    assert [j.id for j in none.data] == [plain.id]


async def test_a_job_seen_through_its_life(env: Env) -> None:
    job = await env.alice.fine_tuning.jobs.create(
        model="tiny",
        training_file=await upload(env.alice),
        hyperparameters={"n_epochs": 2, "batch_size": 5},
    )
    job_id = "job-" + job.id.removeprefix("ftjob-")
    # A job that has not ended keeps its file.
    with pytest.raises(openai.ConflictError) as in_use:
        await env.alice.files.delete(job.training_file)
    assert in_use.value.code == "file_in_use"
    broker = make_broker(env.settings, "test")
    await broker.start()
    subjects = Subjects(env.settings.namespace)

    async def report(*events: object) -> None:
        for event in events:
            await publish_job_event(broker, subjects, "test", event)  # type: ignore[arg-type]

    def running(record: JobRecord) -> JobRecord:
        record.state, record.attempt = JobState.running, 1
        record.assigned_at = record.updated_at - timedelta(seconds=10)
        record.metrics = {"step": 1}
        return record

    try:
        await report(Started(job_id=job_id, attempt=1, worker_id="w"))
        progress = [
            Progress(
                job_id=job_id,
                attempt=1,
                step=s,
                max_steps=4,
                loss=2.0 / s,
                lr=1e-4,
                tokens_per_s=100.0,
                tokens=50 + s,
            )
            for s in (1, 2, 3, 4)
        ]
        await report(progress[0])
        await env.jobs.modify(job_id, running)
        seen = await env.alice.fine_tuning.jobs.retrieve(job.id)
        assert seen.status == "running"
        assert seen.estimated_finish is not None
        assert seen.trained_tokens is None
        await report(
            CheckpointSaved(job_id=job_id, attempt=1, step=2, store_key="c/2"),
            *progress[1:],
            Validated(job_id=job_id, attempt=1, step=4, eval_loss=0.4, perplexity=1.5),
            CheckpointSaved(job_id=job_id, attempt=1, step=4, store_key="c/4"),
            Succeeded(
                job_id=job_id, attempt=1, adapter=AdapterRef(name="ft", version=3, store_key="a")
            ),
        )
    finally:
        await broker.stop()

    def succeeded(record: JobRecord) -> JobRecord:
        record.state = JobState.succeeded
        record.checkpoints = [2, 4]
        record.adapter = AdapterRef(name="ft", version=3, store_key="a")
        return record

    await env.jobs.modify(job_id, succeeded)
    done = await env.alice.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded"
    assert done.fine_tuned_model == "ft@3"
    assert done.trained_tokens == 51 + 52 + 53 + 54
    assert done.finished_at is not None
    assert done.estimated_finish is None
    assert done.result_files == ["file-results-" + job.id.removeprefix("ftjob-")]
    with pytest.raises(openai.NotFoundError):  # another tenant's job's results
        await env.bob.files.content(done.result_files[0])

    page = await env.alice.fine_tuning.jobs.list_events(job.id, limit=3)
    assert page.has_more
    assert next(e.message for e in page.data).startswith("Job succeeded: fine-tuned model ft@3")
    events = [e async for e in await env.alice.fine_tuning.jobs.list_events(job.id, limit=3)]
    assert len(events) == 9  # newest first, every page
    assert [e.created_at for e in events] == sorted((e.created_at for e in events), reverse=True)
    metrics = [e for e in events if e.type == "metrics"]
    assert [m.data["step"] for m in metrics] == [4, 4, 3, 2, 1]  # type: ignore[index]
    assert metrics[1].data["train_loss"] == pytest.approx(0.5)  # type: ignore[index]

    checkpoints = await env.alice.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [4, 2]
    latest = checkpoints.data[0]
    assert latest.metrics.train_loss == pytest.approx(0.5)
    assert latest.metrics.valid_loss == pytest.approx(0.4)
    assert latest.fine_tuned_model_checkpoint == f"{job_id}@4"
    assert latest.fine_tuning_job_id == job.id


async def test_models_retrieve_answers_every_listed_id(env: Env) -> None:
    listed = await env.alice.models.list()
    ids = [m.id for m in listed.data]
    assert set(ids) == {"tiny", "tiny@1", "bot", "bot@1"}
    for model_id in [*ids, "bot@prod", "tiny@2"]:
        found = await env.alice.models.retrieve(model_id)
        assert found.id == model_id
        assert found.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        await env.alice.models.retrieve("nope@9")
    assert missing.value.code == "model_not_found"


async def test_a_response_format_that_is_not_honoured_is_refused(env: Env) -> None:
    # Refused before the model is looked up: no worker is needed to say no.
    with pytest.raises(openai.BadRequestError) as refused:
        await env.alice.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "xml"},  # type: ignore[typeddict-item]
        )
    assert refused.value.param == "response_format"
    with pytest.raises(openai.BadRequestError) as no_schema:
        await env.alice.completions.create(
            model="tiny",
            prompt="hi",
            extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        )
    assert no_schema.value.param == "response_format.json_schema.schema"

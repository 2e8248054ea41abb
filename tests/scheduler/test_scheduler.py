"""The scheduler against a real nats-server and a real registry."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from swarm_contracts.events import Failed, Requeued, Started, Succeeded
from swarm_contracts.jobs import AdapterRef, JobState, job_id_for, utcnow
from swarm_contracts.workers import Gpu, Resources, RunningJob, WorkerInfo
from swarm_runtime.records import RecordTable
from swarm_runtime.topology import kv_bucket

from .conftest import Harness


def names(events: list[dict]) -> list[str]:
    return [e["data"]["event"] for e in events]


async def test_a_duplicate_submission_makes_one_job(harness: Harness) -> None:
    spec = harness.spec()
    for _ in range(5):  # JetStream drops the copies by Nats-Msg-Id
        await harness.submit(spec, msg_id="key-1")
    # Past the de-duplication window the job id (derived from the key) still makes one job.
    job_id = job_id_for("default", "key-1")
    await harness.submit(spec, msg_id="another-msg-id", job_id=job_id)
    await harness.wait_record(job_id, lambda r: r.state == JobState.queued)
    await asyncio.sleep(0.5)
    assert await harness.jobs.keys() == [job_id]
    assert names(await harness.events()) == ["queued"]


async def test_a_malformed_submission_is_dead_lettered_and_serving_goes_on(
    harness: Harness,
) -> None:
    await harness.js.publish(
        harness.subjects.submit, b"{not json", headers={"Nats-Msg-Id": "bad-1"}
    )
    await harness.js.publish(harness.subjects.submit, b'{"specversion": "1.0", "data": {}}')
    await harness.submit(harness.spec(), msg_id="good")
    await harness.wait_record(job_id_for("default", "good"), lambda r: r.state == JobState.queued)

    sub = await harness.js.subscribe(
        harness.subjects.dead_letter("scheduler"), ordered_consumer=True
    )
    parked = [await sub.next_msg(timeout=5), await sub.next_msg(timeout=5)]
    await sub.unsubscribe()
    assert parked[0].data == b"{not json"
    assert parked[0].headers["Swarm-Original-Subject"] == harness.subjects.submit
    assert "data.spec" in parked[1].headers["Swarm-Error"]


async def test_an_unknown_base_model_fails_the_job_with_the_reason(harness: Harness) -> None:
    await harness.submit(harness.spec(base_model="no-such-model"), msg_id="k")
    job_id = job_id_for("default", "k")
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.failed)
    assert "no-such-model" in (record.reason or "")
    events = await harness.events(job_id)
    assert names(events) == ["queued", "failed"]
    assert "no-such-model" in events[-1]["data"]["reason"]


async def test_a_job_waits_with_a_reason_then_goes_to_a_worker_that_fits(harness: Harness) -> None:
    await harness.submit(harness.spec(resources={"workers": 1, "cpus_per_worker": 2}), msg_id="k")
    job_id = job_id_for("default", "k")
    await harness.wait_record(job_id, lambda r: r.reason == "waiting for a worker: none is alive")

    await harness.heartbeat("small", cpus=1)
    await harness.wait_record(job_id, lambda r: r.reason is not None and "can ever fit" in r.reason)
    await harness.heartbeat("big", cpus=4)
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    assert (record.worker_id, record.attempt) == ("big", 1)
    [assignment] = await harness.assignments("big")
    assert assignment["job_id"] == job_id
    assert assignment["attempt"] == 1
    assert assignment["base_model"]["name"] == "tiny"
    assert assignment["base_model"]["version"] == 1
    assert assignment["dataset"]["id"] == harness.spec()["dataset"]
    assert names(await harness.events(job_id)) == ["queued", "assigned"]


LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "vocab_size": 128256,
    "dtype": "bfloat16",
}


async def test_a_gpu_job_waits_for_a_gpu_as_big_as_its_memory_estimate(
    harness: Harness, tmp_path: Path
) -> None:
    await harness.register_model("llama", tmp_path, LLAMA_1B)
    spec = harness.spec(
        base_model="llama",
        lora={"r": 16, "target_modules": "all-linear"},
        training={"batch_size": 16, "seq_len": 2048},
        resources={"gpus_per_worker": 1},
    )
    await harness.submit(spec, msg_id="k")
    job_id = job_id_for("default", "k")
    record = await harness.wait_record(job_id, lambda r: r.memory is not None)
    assert record.memory is not None
    assert record.memory.base_model == "llama@1"
    need_gb = record.memory.total_bytes / (1 << 30)
    assert 80 < need_gb < 141  # activations and 128k-vocabulary logits of 32k tokens

    h100 = [Gpu(index=0, name="H100", memory_bytes=80 << 30)]
    await harness.heartbeat("h100", cpus=4, gpus=h100)
    await harness.wait_record(
        job_id, lambda r: r.reason is not None and "estimated need" in r.reason
    )
    h200 = [Gpu(index=0, name="H200", memory_bytes=141 << 30)]
    await harness.heartbeat("h200", cpus=4, gpus=h200)
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    assert record.worker_id == "h200"


async def test_a_lost_worker_s_job_moves_on_and_its_late_result_is_rejected(
    harness: Harness,
) -> None:
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    await harness.heartbeat("w1")
    await harness.wait_record(
        job_id, lambda r: r.state == JobState.assigned and r.worker_id == "w1"
    )
    await harness.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
    await harness.wait_record(job_id, lambda r: r.state == JobState.running)

    # w1 goes silent; w2 beats all along (a scheduler slow on a loaded machine must not find
    # w2 silent too by the time it places the job again), listing attempt 2 once it has it.
    second: list[RunningJob] = []
    async with harness.beating("w2", running=lambda: second):
        record = await harness.wait_record(job_id, lambda r: r.worker_id == "w2")
        assert record.attempt == 2
        assert record.state == JobState.assigned
        second.append(RunningJob(job_id=job_id, attempt=2))

        adapter = AdapterRef(name="adapter", version=1, store_key="adapters/default/adapter/1")
        await harness.emit(Succeeded(job_id=job_id, attempt=1, adapter=adapter))  # late, stale
        await asyncio.sleep(0.5)
        stale = await harness.jobs.get(job_id)
        assert stale is not None
        assert stale[0].state == JobState.assigned

        await harness.emit(Started(job_id=job_id, attempt=2, worker_id="w2"))
        await harness.emit(Succeeded(job_id=job_id, attempt=2, adapter=adapter))
        done = await harness.wait_record(job_id, lambda r: r.state == JobState.succeeded)
    assert done.adapter == adapter
    # The stale report changed nothing, and nobody following the job saw it: the scheduler
    # publishes only the events it accepted.
    assert names(await harness.events(job_id)) == [
        "queued",
        "assigned",
        "started",
        "requeued",
        "assigned",
        "started",
        "succeeded",
    ]


async def test_a_worker_may_not_send_the_schedulers_own_events(harness: Harness) -> None:
    # Who may send what is the event's meaning (`Requeued.meaning.origin`: the scheduler).
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    await harness.heartbeat("w1")
    await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    # From the attempt's own worker, with its token: still not the worker's to say.
    await harness.emit(Requeued(job_id=job_id, attempt=1, reason="I say so"))
    await harness.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.running)
    assert (record.attempt, record.worker_id) == (1, "w1")
    assert names(await harness.events(job_id)) == ["queued", "assigned", "started"]


async def test_a_paused_scheduler_does_not_take_jobs_from_workers_that_kept_beating(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A scheduler starved of CPU past the worker timeout wakes to a socket full of unread
    heartbeats: its silence is not the workers'."""
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    listing = [RunningJob(job_id=job_id, attempt=1)]
    async with harness.beating("w1", running=lambda: listing):
        await harness.wait_record(job_id, lambda r: r.worker_id == "w1")
        await harness.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
        await harness.wait_record(job_id, lambda r: r.state == JobState.running)
        time.sleep(2 * harness.settings.worker_timeout_s)  # noqa: ASYNC251 - the whole process pauses
        await asyncio.sleep(3 * harness.settings.worker_timeout_s)
        record = (await harness.jobs.get(job_id))[0]  # type: ignore[index]
    assert (record.state, record.attempt, record.worker_id) == (JobState.running, 1, "w1")
    assert not [r.message for r in caplog.records if "lost" in r.message]


async def test_a_finished_job_leaves_its_revision_in_the_view_and_stays_finished(
    harness: Harness,
) -> None:
    job_id = job_id_for("default", "k")
    await harness.submit(harness.spec(), msg_id="k")
    await harness.heartbeat("w1")
    await harness.wait_record(job_id, lambda r: r.state == JobState.assigned)
    await harness.emit(Started(job_id=job_id, attempt=1, worker_id="w1"))
    adapter = AdapterRef(name="adapter", version=1, store_key="adapters/default/adapter/1")
    await harness.emit(Succeeded(job_id=job_id, attempt=1, adapter=adapter))
    await harness.wait_record(job_id, lambda r: r.state == JobState.succeeded)
    view = harness.scheduler.view
    for _ in range(100):
        if view.finished(job_id):
            break
        await asyncio.sleep(0.05)
    # Of a finished job the view keeps the revision, not the record.
    _, revision = await harness.jobs.get(job_id)  # type: ignore[misc]
    assert view.revisions[job_id] == revision
    assert job_id not in view.open

    # Submitted again past JetStream's window, and reported on late: it stays as it ended.
    await harness.submit(harness.spec(), msg_id="another-msg-id", job_id=job_id)
    await harness.emit(Failed(job_id=job_id, attempt=1, reason="late"))
    for _ in range(200):  # until the scheduler has handled (acked) both
        consumers = [
            await harness.js.consumer_info(stream, durable)
            for stream, durable in (
                (harness.subjects.submit_stream, "scheduler-submit"),
                (harness.subjects.worker_events_stream, "scheduler-worker-events"),
            )
        ]
        if all(c.num_pending == 0 and c.num_ack_pending == 0 for c in consumers):
            break
        await asyncio.sleep(0.05)
    record, after = await harness.jobs.get(job_id)  # type: ignore[misc]
    assert (record.state, record.adapter, after) == (JobState.succeeded, adapter, revision)
    assert names(await harness.events(job_id)) == [
        "queued",
        "assigned",
        "started",
        "succeeded",
    ]  # the late report changed nothing, and nobody following the job saw it


async def test_a_job_fails_after_max_attempts_of_lost_workers(harness: Harness) -> None:
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    await harness.heartbeat("a")
    await harness.wait_record(job_id, lambda r: r.attempt == 1 and r.worker_id == "a")
    # Once "a" is lost, "b" gets attempt 2, then goes silent too.
    while (await harness.jobs.get(job_id))[0].attempt < 2:  # type: ignore[index]
        await harness.heartbeat("b")
        await asyncio.sleep(0.2)
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.failed)
    assert record.reason == "worker b lost; gave up after 2 attempts"


async def test_cancelling_a_queued_job_ends_it(harness: Harness) -> None:
    await harness.submit(harness.spec(), msg_id="k")
    job_id = job_id_for("default", "k")
    await harness.wait_record(job_id, lambda r: r.state == JobState.queued)
    cancel = {
        "specversion": "1.0",
        "id": "c1",
        "source": "test",
        "type": "swarm.job.cancel",
        "data": {"job_id": job_id},
    }
    await harness.js.publish(harness.subjects.cancel(job_id), json.dumps(cancel).encode())
    record = await harness.wait_record(job_id, lambda r: r.state == JobState.cancelled)
    assert record.cancel_requested
    assert names(await harness.events(job_id))[-1] == "cancelled"


async def test_a_worker_that_died_while_no_scheduler_watched_is_shown_lost(
    harness: Harness,
) -> None:
    """Its record said ``alive`` when the last scheduler stopped; no heartbeat ever comes to
    this one, so after a worker timeout it must say ``lost``, not ``alive`` for ever."""
    workers = RecordTable(await kv_bucket(harness.js, harness.subjects, "workers"), WorkerInfo)
    res = Resources(cpus=2, memory_bytes=1 << 30)
    for worker_id, state in (("w-ghost", "alive"), ("w-left", "gone"), ("w-live", "alive")):
        info = WorkerInfo(
            worker_id=worker_id, state=state, resources=res, free=res, last_heartbeat=utcnow()
        )
        await workers.put(worker_id, info)
    async with harness.beating("w-live"):
        for _ in range(100):
            states = {w.worker_id: w.state for w in await workers.all()}
            if states["w-ghost"] == "lost":
                break
            await asyncio.sleep(0.1)
        assert states == {"w-ghost": "lost", "w-left": "gone", "w-live": "alive"}

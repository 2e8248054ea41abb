"""The scheduler verifies jobs against a real registry and nats-server; the workers are played
by the test through the wire contract (heartbeats, assignments, job events)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from swarm_contracts.envelope import envelope
from swarm_contracts.events import CheckpointSaved, Progress, Replayed, Started, Succeeded
from swarm_contracts.jobs import AdapterRef, JobState, job_id_for
from swarm_contracts.layout import output_adapter
from swarm_contracts.registry import Lineage, RegisterAdapter
from swarm_contracts.verification import ReplayReport, VerifyRequest
from swarm_contracts.workers import WorkerOps
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import kv_bucket

from ..registry.conftest import safetensors_bytes
from .conftest import Harness, running_harness

ADAPTER = AdapterRef(name="adapter", version=1, store_key="adapters/default/adapter/1")
LOSSES = {5: 2.0, 6: 1.5}


async def train(h: Harness, job_id: str, worker_id: str, attempt: int = 1) -> None:
    """Play the worker that trains the job: 6 steps, checkpoints at 4 and 6."""
    await h.wait_record(job_id, lambda r: r.attempt == attempt and r.worker_id == worker_id)
    await h.emit(Started(job_id=job_id, attempt=attempt, worker_id=worker_id))
    for step in (4, 5, 6):
        loss = LOSSES.get(step, 3.0)
        progress = Progress(
            job_id=job_id,
            attempt=attempt,
            step=step,
            max_steps=6,
            loss=loss,
            lr=0.1,
            tokens_per_s=1.0,
        )
        await h.emit(progress)
    await h.emit(CheckpointSaved(job_id=job_id, attempt=attempt, step=4, store_key="k"))
    await h.emit(CheckpointSaved(job_id=job_id, attempt=attempt, step=6, store_key="k"))
    await h.emit(Succeeded(job_id=job_id, attempt=attempt, adapter=ADAPTER, metrics={"step": 6}))


async def replay(h: Harness, replay_id: str, worker_id: str, distance: float) -> dict:
    """Play the replaying worker; the assignment it got."""
    await h.wait_record(replay_id, lambda r: r.state == JobState.assigned)
    [assignment] = [a for a in await h.assignments(worker_id) if a["job_id"] == replay_id]
    await h.emit(Started(job_id=replay_id, attempt=1, worker_id=worker_id))
    report = ReplayReport(from_step=4, to_step=6, distances={"q.lora_B": distance}, losses=LOSSES)
    await h.emit(Replayed(job_id=replay_id, attempt=1, worker_id=worker_id, report=report))
    return assignment


async def test_a_mismatch_marks_the_worker_suspect_and_reruns_the_job_elsewhere(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(
        settings, tmp_path, verify_fraction=1.0, verify_policy="rerun", worker_timeout_s=30
    ) as h:
        await h.submit(h.spec(training={"max_steps": 6, "checkpoint_every": 2}), msg_id="k")
        job_id = job_id_for("default", "k")
        async with h.beating("w1", labels={"provider": "acme"}):
            await train(h, job_id, "w1")
            record = await h.wait_record(job_id, lambda r: r.verification is not None)
            assert record.checkpoints == [4, 6]
            assert record.verification is not None
            replay_id = record.verification.replay_job_id
            waiting = await h.wait_record(replay_id, lambda r: r.reason is not None)
            assert "none is alive but w1 or of provider acme" in (waiting.reason or "")
            # w2 is of w1's provider: only w3 may replay.
            async with h.beating("w2", labels={"provider": "acme"}), h.beating("w3"):
                assignment = await replay(h, replay_id, "w3", distance=0.4)
                assert assignment["verify"]["job_id"] == job_id
                assert (assignment["verify"]["from_step"], assignment["verify"]["to_step"]) == (
                    4,
                    6,
                )
                # Rerun: from the start (not from w1's checkpoints), never on w1.
                again = await h.wait_record(job_id, lambda r: r.attempt == 2)
                assert again.worker_id in ("w2", "w3")
                [second] = [
                    a for a in await h.assignments(again.worker_id or "") if a["job_id"] == job_id
                ]
                assert second["resume_after_attempt"] == 1
        assert again.verification is not None
        assert again.verification.outcome == "failed"
        events = await h.events(job_id)
        names = [e["data"]["event"] for e in events]
        # What became of the job is on record before the ``verified`` event says it.
        assert names.index("requeued") < names.index("verified")
        [verified] = [e["data"] for e in events if e["data"]["event"] == "verified"]
        assert verified["outcome"] == "failed"
        assert (verified["action"], verified["policy"]) == ("rerun", "rerun")
        assert verified["worst_matrix"] == "q.lora_B"
        assert verified["max_loss_difference"] == 0.0
        ops = RecordTable(await kv_bucket(h.js, h.subjects, "worker_ops"), WorkerOps)
        found = await ops.get("w1")
        assert found is not None
        assert found[0].suspect
        assert "q.lora_B" in found[0].suspect_reason


async def test_a_job_verified_on_request_passes_and_stays_succeeded(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, worker_timeout_s=30) as h:
        await h.submit(h.spec(training={"max_steps": 6, "checkpoint_every": 2}), msg_id="k")
        job_id = job_id_for("default", "k")
        async with h.beating("w1"):
            await train(h, job_id, "w1")
            await h.wait_record(job_id, lambda r: r.state == JobState.succeeded)
        # SWARM_VERIFY_FRACTION is 0: nothing until asked (as the gateway asks).
        for _ in range(2):  # asked twice: one replay
            request = envelope("gateway", "swarm.job.verify", VerifyRequest(job_id=job_id))
            await h.js.publish(h.subjects.verify(job_id), request.model_dump_json().encode())
        record = await h.wait_record(job_id, lambda r: r.verification is not None)
        assert record.verification is not None
        async with h.beating("w2"):
            await replay(h, record.verification.replay_job_id, "w2", distance=1e-6)
            done = await h.wait_record(
                job_id, lambda r: r.verification and r.verification.outcome != "pending"
            )
        assert done.verification is not None
        assert done.verification.outcome == "passed"
        replay_events = await h.events(done.verification.replay_job_id)
        assert [e["data"]["event"] for e in replay_events].count("queued") == 1
        assert done.state == JobState.succeeded
        [verified] = [e["data"] for e in await h.events(job_id) if e["data"]["event"] == "verified"]
        assert (verified["outcome"], verified["action"]) == ("passed", "none")
        assert verified["overhead"] == 2 / 6
        assert json.dumps(verified)  # plain JSON: no infinities
        # The overhead in total: replayed steps over the steps of the jobs they verified.
        assert h.scheduler is not None
        assert h.scheduler.metrics is not None
        registry = h.scheduler.metrics.registry
        assert registry.get_sample_value("swarm_scheduler_replayed_steps_total") == 2
        assert registry.get_sample_value("swarm_scheduler_verified_job_steps_total") == 6
        passed = {"outcome": "passed"}
        assert registry.get_sample_value("swarm_scheduler_verifications_total", passed) == 1


async def register_output(h: Harness, job_id: str, token: str | None) -> dict:
    """Register the job's adapter as its worker does (its output, its attempt's token)."""
    record = (await h.jobs.get(job_id) or (None,))[0]
    assert record is not None
    assert record.base_model is not None
    key = output_adapter(job_id, record.attempt)
    store = open_store(h.settings)
    store.put_bytes(f"{key}/adapter_config.json", b'{"r": 8}')
    store.put_bytes(f"{key}/adapter_model.safetensors", safetensors_bytes({"lora_A": [2, 4]}))
    lineage = Lineage(
        tenant=record.tenant,
        job_id=job_id,
        attempt=record.attempt,
        base_model=record.base_model.name,
        base_model_version=record.base_model.version,
        base_model_digest=record.base_model.digest,
        dataset=record.spec.dataset,
        dataset_digest="0" * 64,
        lora=record.spec.lora,
        training=record.spec.training,
    )
    request = RegisterAdapter(
        name=record.spec.name, store_key=key, lineage=lineage, attempt_token=token
    )
    reply = await h.nc.request(
        h.subjects.registry("adapters.register"), request.model_dump_json().encode(), timeout=10
    )
    answer = json.loads(reply.data)
    assert answer["ok"], answer
    return answer["result"]


async def test_a_failed_verification_quarantines_the_job_s_adapter(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_harness(settings, tmp_path, worker_timeout_s=30) as h:
        await h.submit(h.spec(training={"max_steps": 6, "checkpoint_every": 2}), msg_id="k")
        job_id = job_id_for("default", "k")
        async with h.beating("w1"):
            await train(h, job_id, "w1")
            await h.wait_record(job_id, lambda r: r.state == JobState.succeeded)
        version = await register_output(h, job_id, await h.attempt_token(job_id, 1))
        assert version["quarantine"] is None
        request = envelope("gateway", "swarm.job.verify", VerifyRequest(job_id=job_id))
        await h.js.publish(h.subjects.verify(job_id), request.model_dump_json().encode())
        record = await h.wait_record(job_id, lambda r: r.verification is not None)
        assert record.verification is not None
        async with h.beating("w2"):
            await replay(h, record.verification.replay_job_id, "w2", distance=0.7)
            done = await h.wait_record(job_id, lambda r: r.state == JobState.failed)
        assert done.verification is not None
        assert done.verification.outcome == "failed"
        get = {"name": "adapter", "version": version["version"], "tenant": "default"}
        for _ in range(50):
            shown = json.loads(
                (
                    await h.nc.request(
                        h.subjects.registry("adapters.get"),
                        json.dumps(get | {"include_quarantined": True}).encode(),
                        timeout=10,
                    )
                ).data
            )
            if shown["result"]["quarantine"] is not None:
                break
            await asyncio.sleep(0.1)
        assert "q.lora_B" in shown["result"]["quarantine"]["reason"]
        assert shown["result"]["quarantine"]["job_id"] == job_id
        served = await h.nc.request(
            h.subjects.registry("adapters.get"), json.dumps(get).encode(), timeout=10
        )
        assert json.loads(served.data)["code"] == "conflict"

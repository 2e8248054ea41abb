"""``POST /v1/jobs/{id}/verify``: the owner (or an admin) asks the scheduler for a replay."""

from __future__ import annotations

import httpx
import nats

from swarm_contracts.envelope import CloudEvent
from swarm_contracts.jobs import JobRecord, JobSpec, JobState
from swarm_contracts.subjects import Subjects
from swarm_contracts.verification import VerifyRequest
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology, kv_bucket

ALICE, BOB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
SPEC = JobSpec(name="a", base_model="tiny", dataset="ds-" + "0" * 16)


async def test_verify_is_the_owner_s_and_only_for_a_replayable_job(
    auth_client: httpx.AsyncClient, auth_settings: Settings
) -> None:
    nc = await nats.connect(auth_settings.nats_url)
    js, subjects = nc.jetstream(), Subjects(auth_settings.namespace)
    await ensure_topology(js, subjects)
    jobs = RecordTable(await kv_bucket(js, subjects, "jobs"), JobRecord)
    try:
        record = JobRecord(
            job_id="job-aaaaaaaa", tenant="alice", spec=SPEC, state=JobState.running, attempt=1
        )
        await jobs.put(record.job_id, record)
        path = f"/v1/jobs/{record.job_id}/verify"

        assert (await auth_client.post(path, headers=BOB)).status_code == 404  # not bob's
        running = await auth_client.post(path, headers=ALICE)
        assert running.status_code == 409
        assert "only a succeeded job" in running.json()["detail"]

        record.state, record.checkpoints = JobState.succeeded, [6]
        await jobs.put(record.job_id, record)
        one = await auth_client.post(path, headers=ALICE)
        assert one.status_code == 409
        assert "fewer than two committed checkpoints" in one.json()["detail"]

        record.checkpoints = [4, 6]
        await jobs.put(record.job_id, record)
        accepted = await auth_client.post(path, headers=ALICE)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["job_id"] == record.job_id
        msg = await js.get_last_msg(subjects.control_stream, subjects.verify(record.job_id))
        event = CloudEvent[VerifyRequest].model_validate_json(msg.data)
        assert event.type == "swarm.job.verify"
        assert event.data.job_id == record.job_id
    finally:
        await nc.close()

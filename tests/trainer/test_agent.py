"""The agent against a real nats-server (and the real registry when it is installed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from swarm_contracts.envelope import envelope
from swarm_contracts.events import CancelRequest
from swarm_contracts.jobs import JobRecord, JobState
from swarm_contracts.providers import token_digest
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Assignment
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.store import open_store
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_trainer.agent import TrainerAgent
from swarm_trainer.app import build_app
from swarm_trainer.settings import TrainerSettings

from .conftest import make_assignment

pytestmark = pytest.mark.slow


class Events:
    """Every job event of one namespace, as (event name, data) in arrival order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.cancel_latency_s = 0.0
        self.stopped_latency_s = 0.0
        self.torn_down_s = 0.0

    def names(self) -> list[str]:
        return [name for name, _ in self.items]

    async def wait_for(self, name: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            for n, data in self.items:
                if n == name:
                    return data
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {name} event; got {self.names()}")


async def publish_assignment(nc: Any, s: Subjects, job: Assignment) -> None:
    js = nc.jetstream()
    await ensure_topology(js, s)
    jobs = RecordTable(await kv_bucket(js, s, "jobs"), JobRecord)
    record = JobRecord(
        job_id=job.job_id,
        tenant=job.tenant,
        spec=job.spec,
        state=JobState.assigned,
        attempt=job.attempt,
        worker_id=job.worker_id,
        base_model=job.base_model,
        attempt_token_sha256=token_digest(job.attempt_token) if job.attempt_token else None,
    )
    await jobs.create(job.job_id, record)
    event = envelope("scheduler", "swarm.worker.assign", job, subject=job.job_id)
    await js.publish(s.assign(job.worker_id), event.model_dump_json().encode())


async def record_job(
    agent: Any, job: Assignment, state: JobState, attempt: int, worker_id: str, **extra: Any
) -> JobRecord:
    """The scheduler's record of ``job`` as a test needs it: its state, attempt and worker."""
    record = JobRecord(
        job_id=job.job_id,
        tenant="default",
        spec=job.spec,
        state=state,
        attempt=attempt,
        worker_id=worker_id,
        **extra,
    )
    await agent.jobs.create(job.job_id, record)
    return record


async def run_agent_job(
    settings: Settings,
    tiny_model_dir: Path,
    training: dict[str, Any],
    cancel: bool = False,
    model_key: str | None = None,
    lora: dict[str, Any] | None = None,
    cancel_after: str = "progress",
) -> tuple[Events, Assignment, Any]:
    s = Subjects(settings.namespace)
    settings = TrainerSettings.of(settings, worker_id="w-test", heartbeat_interval_s=0.5)
    store = open_store(settings)
    job = make_assignment(store, tiny_model_dir, worker_id="w-test", training=training, lora=lora)
    if model_key is not None:
        job.base_model.store_key = model_key
    events = Events()
    nc = await nats.connect(settings.nats_url)

    async def on_event(msg: Any) -> None:
        body = json.loads(msg.data)
        events.items.append((msg.subject.rsplit(".", 1)[-1], body["data"]))

    async def on_heartbeat(msg: Any) -> None:
        events.heartbeats.append(json.loads(msg.data)["data"])

    # What the agent reports, on its own worker subject (the scheduler, absent here, would
    # republish it on the job's public events).
    await nc.subscribe(s.worker_event(job.worker_id, job.job_id, "*"), cb=on_event)
    await nc.subscribe(s.heartbeat("w-test"), cb=on_heartbeat)

    apps = [build_app(settings)]
    try:
        from swarm_registry.app import build_app as build_registry
    except ImportError:
        build_registry = None
    if build_registry is not None and not cancel:
        apps.append(build_registry(settings))
    for app in apps:
        await app.start()
    try:
        await publish_assignment(nc, s, job)
        if cancel:
            await events.wait_for(cancel_after)
            # A reason other than the default: the `cancelled` event must carry it.
            cancel_request = CancelRequest(job_id=job.job_id, reason="pruned")
            request = envelope("gateway", "swarm.job.cancel", cancel_request)
            asked = asyncio.get_running_loop().time()
            await nc.publish(s.cancel(job.job_id), request.model_dump_json().encode())
            await events.wait_for("cancelled", timeout=30)
            events.cancel_latency_s = asyncio.get_running_loop().time() - asked
            await _stopping(events, apps[0].agent, asked)  # type: ignore[attr-defined]
        else:
            await asyncio.wait_for(_terminal(events), 180)
    finally:
        for app in reversed(apps):
            await app.stop()
        await nc.close()
    return events, job, build_registry


async def _stopping(events: Events, agent: TrainerAgent, asked: float) -> None:
    """When (since ``asked``) the agent let go of the cancelled job (its heartbeats stop
    listing it), and when its run had stopped too."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline and not (
        events.heartbeats and not events.heartbeats[-1]["running"]
    ):
        await asyncio.sleep(0.2)
    events.stopped_latency_s = loop.time() - asked
    while loop.time() < deadline + 60 and (agent.active or agent.retiring):
        await asyncio.sleep(0.2)
    events.torn_down_s = loop.time() - asked


async def _terminal(events: Events) -> None:
    while not set(events.names()) & {"succeeded", "failed", "cancelled"}:
        await asyncio.sleep(0.1)


async def test_agent_runs_an_assignment_to_the_end(
    ray_cluster: None, settings: Settings, tiny_model_dir: Path
) -> None:
    events, job, registry = await run_agent_job(settings, tiny_model_dir, {"max_steps": 6})
    names = events.names()
    assert names[0] == "started", names
    assert names.count("progress") == 6
    assert names.count("checkpoint") == 2  # steps 5 and 6 (the end)
    assert "validated" in names
    checkpoint = next(d for n, d in events.items if n == "checkpoint")
    assert checkpoint["store_key"] == f"checkpoints/{job.job_id}/attempt-1/checkpoint_00000005"
    assert open_store(settings).exists(checkpoint["store_key"] + "/adapter_model.safetensors")
    assert events.heartbeats
    assert events.heartbeats[0]["worker_id"] == "w-test"
    assert any(h["running"] for h in events.heartbeats)
    # Once the run has the base model, the heartbeats say this worker holds it.
    assert events.heartbeats[0]["cached_models"] == []
    assert any(h["cached_models"] == [job.base_model.digest] for h in events.heartbeats)
    if registry is None:
        pytest.skip("swarm_registry not installed: registration left to the e2e test")
    done = await events.wait_for("succeeded", timeout=1)
    assert done["adapter"]["name"] == "arith"
    assert done["adapter"]["version"] == 1
    assert done["metrics"]["eval_loss"] > 0
    assert done["metrics"]["train_loss"] > 0
    assert open_store(settings).exists(done["adapter"]["store_key"] + "/adapter_config.json")


async def test_agent_cancels_a_running_job(
    ray_cluster: None, settings: Settings, tiny_model_dir: Path
) -> None:
    events, _, _ = await run_agent_job(
        settings, tiny_model_dir, {"max_steps": 100000, "checkpoint_every": 3}, cancel=True
    )
    assert "succeeded" not in events.names()
    assert events.names()[-1] == "cancelled"
    assert events.items[-1][1]["reason"] == "pruned"  # the request's reason, carried through
    # Stopping includes Ray tearing the run's workers down (2-6 s on a loaded 2-core CI
    # machine); the bound catches a cancel that waits for the run's end or a lease instead.
    assert events.cancel_latency_s < 15.0


async def test_a_cancel_takes_effect_within_seconds_while_ray_starts_the_run(
    ray_cluster: None, settings: Settings, tiny_model_dir: Path
) -> None:
    """Until the training loop runs, nothing polls the cancel flag (here the run stalls five
    minutes before its first step, as Ray's and the ranks' start-up take tens of seconds on a
    loaded machine): the agent aborts the Ray run and reports the cancel within seconds."""
    settings = TrainerSettings.of(settings, trainer_test_hook="stall_start")
    events, _, _ = await run_agent_job(
        settings, tiny_model_dir, {"max_steps": 1000}, cancel=True, cancel_after="started"
    )
    assert events.names()[-1] == "cancelled"
    assert events.items[-1][1]["reason"] == "pruned"
    assert events.cancel_latency_s <= 5.0
    assert events.stopped_latency_s < 10.0  # the agent let go of the job
    # Ray tore the run down (its controller, and with it the ranks, killed once it had
    # started: tens of seconds on a loaded machine), not five minutes later.
    assert events.torn_down_s < 90.0
    # And gave back the CPUs its ranks held: a killed controller leaves its placement group,
    # which would keep the next attempt placed on this worker waiting forever.
    # (A kill asked while the group starts waits for it: up to a minute on a loaded machine.)
    assert await _placement_groups_left(timeout=90.0) == []


async def _placement_groups_left(timeout: float) -> list[str]:
    """The ids of placement groups not removed ``timeout`` seconds from now (or sooner)."""
    from ray.util import placement_group_table

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = [pg for pg, info in placement_group_table().items() if info["state"] != "REMOVED"]
        if not left or loop.time() > deadline:
            return left
        await asyncio.sleep(0.5)


async def test_agent_fails_a_job_whose_model_is_missing(
    ray_cluster: None, settings: Settings, tiny_model_dir: Path
) -> None:
    events, _, _ = await run_agent_job(
        settings, tiny_model_dir, {}, cancel=False, model_key="models/gone/0000"
    )
    assert events.names() == ["started", "failed"]
    assert "no config.json under 'models/gone/0000'" in events.items[-1][1]["reason"]


async def test_agent_fails_a_qlora_job_it_cannot_quantize_with_the_reason(
    ray_cluster: None, settings: Settings, tiny_model_dir: Path
) -> None:
    events, _, _ = await run_agent_job(
        settings, tiny_model_dir, {}, cancel=False, lora={"quantize": "nf4"}
    )
    assert events.names() == ["started", "failed"]
    assert events.items[-1][1]["reason"] == (
        "lora.quantize nf4 needs GPUs (resources.gpus_per_worker > 0)"
    )


async def bare_agent(settings: Settings) -> TrainerAgent:
    """An agent (worker ``w-test``) connected to NATS, with no Ray and no subscriptions."""
    app = build_app(TrainerSettings.of(settings, worker_id="w-test"))
    agent: TrainerAgent = app.agent  # type: ignore[attr-defined]
    await agent.broker.connect()
    js = agent.broker.connection.jetstream()
    s = Subjects(settings.namespace)
    await ensure_topology(js, s)
    agent.jobs = RecordTable(await kv_bucket(js, s, "jobs"), JobRecord)
    return agent


async def test_agent_drops_an_assignment_the_record_does_not_confirm(
    settings: Settings, tiny_model_dir: Path
) -> None:
    agent = await bare_agent(settings)
    job = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test", attempt=2)
    assert not await agent.accept(job)  # no record at all
    await record_job(agent, job, JobState.assigned, 3, "w-test")
    assert not await agent.accept(job)  # a newer attempt owns the job
    assert not await agent.accept(job.model_copy(update={"worker_id": "other"}))
    await agent.broker.stop()


async def test_a_new_attempt_of_a_job_the_agent_still_runs_stops_the_stale_run(
    settings: Settings, tiny_model_dir: Path
) -> None:
    """Frozen past its lease, then woken, the agent still runs attempt 1 when the scheduler
    places attempt 2 on it again: it stops the stale run and takes the new attempt at once,
    without waiting for the stale run to stop (Ray may take a minute to stop a run it is
    starting; dropping the new attempt would leave the job assigned until the assign timeout).
    """
    from swarm_trainer.attempt import Attempt

    agent = await bare_agent(settings)
    new = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test", attempt=2)
    stale = Attempt(agent, new.model_copy(update={"attempt": 1}))

    async def stale_run() -> None:  # a run Ray is slow to stop
        await asyncio.sleep(60)

    stale.task = asyncio.create_task(stale_run())
    agent.active[new.job_id] = stale
    await record_job(agent, new, JobState.assigned, 2, "w-test")
    assert await asyncio.wait_for(agent.accept(new), 5)
    taken = agent.active[new.job_id]
    assert taken.task is not None
    taken.task.cancel()  # before it starts: no Ray run in this test
    assert stale.superseded
    assert stale.cancel_requested
    assert not stale.task.done()  # still stopping, out of the way of the new attempt
    assert stale.task in agent.retiring
    assert taken.job.attempt == 2
    stale.task.cancel()
    await agent.broker.stop()


async def test_a_run_that_fails_after_its_lease_lapsed_sends_no_final_event(
    settings: Settings, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale attempt's ``failed`` would be a second final event in the job's stream once
    the newer attempt ends; the current attempt's failure is still reported."""
    import swarm_trainer.control
    from swarm_trainer.attempt import Attempt

    def broken() -> None:
        raise OSError("the store went away")

    monkeypatch.setattr(swarm_trainer.control, "make_control", broken)
    agent = await bare_agent(settings)
    sent: list[tuple[str, int]] = []

    async def emit(event: Any, step: int | str = "") -> None:
        sent.append((event.event, event.attempt))

    monkeypatch.setattr(agent, "emit", emit)
    job = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test", attempt=1)
    await record_job(agent, job, JobState.running, 2, "elsewhere")
    await Attempt(agent, job).run()
    assert sent == []
    await Attempt(agent, job.model_copy(update={"attempt": 2, "worker_id": "w-test"})).run()
    assert sent == []  # attempt 2 runs elsewhere, not here: still not ours to end
    found = await agent.jobs.get(job.job_id)
    assert found is not None
    await agent.jobs.update(
        job.job_id, found[0].model_copy(update={"worker_id": "w-test"}), found[1]
    )
    await Attempt(agent, job.model_copy(update={"attempt": 2, "worker_id": "w-test"})).run()
    assert sent == [("failed", 2)]
    await agent.broker.stop()


def emit_after_an_outage(agent: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The agent's events as NATS takes them once its first two publishes failed (a restart:
    a timeout, then the dropped connection)."""
    sent: list[Any] = []
    failures = iter([TimeoutError(), ConnectionError("nats: unexpected EOF")])

    async def emit(event: Any, step: int | str = "") -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        sent.append(event)

    monkeypatch.setattr(agent, "emit", emit)
    return sent


async def test_a_progress_event_that_nats_cannot_take_now_is_sent_once_it_can(
    settings: Settings, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NATS restart while the trainer steps: the step's progress is retried, not dropped
    (followers and the invariants of tests/soak count on every step's event)."""
    from swarm_trainer import reports
    from swarm_trainer.attempt import Attempt

    agent = await bare_agent(settings)
    sent = emit_after_an_outage(agent, monkeypatch)
    job = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test", attempt=1)
    attempt = Attempt(agent, job)
    progress = dict(max_steps=2, loss=1.0, lr=1e-3, tokens_per_s=1.0, elapsed_s=1.0, step_s=1.0)
    await attempt._advise(reports.Progress(step=1, **progress))
    await attempt._advise(reports.Progress(step=2, **progress))
    assert [event.step for event in sent] == [1, 2]
    await agent.broker.stop()


async def test_the_attempt_s_own_events_go_out_through_a_nats_outage(
    settings: Settings, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``started`` and the terminal events are retried like progress: a NATS restart just
    after an assignment (found by tests/faults' restart test) must not fail the attempt."""
    import swarm_trainer.control
    from swarm_trainer.attempt import Attempt

    def broken() -> None:
        raise OSError("the store went away")

    monkeypatch.setattr(swarm_trainer.control, "make_control", broken)
    agent = await bare_agent(settings)
    sent = emit_after_an_outage(agent, monkeypatch)
    job = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test", attempt=1)
    await record_job(agent, job, JobState.running, 1, "w-test")
    await Attempt(agent, job).run()
    assert [event.event for event in sent] == ["failed"]  # after two tries NATS refused
    await agent.broker.stop()


async def test_an_agent_that_missed_the_pause_request_hands_the_job_back_at_its_next_check(
    settings: Settings, tiny_model_dir: Path
) -> None:
    """The scheduler's request to hand a paused job back is core NATS; an agent that missed
    it reads ``release_requested`` when it next asks about its attempt, and hands the job
    back: a run that trained nothing yet is stopped at once and reported ``released``."""
    from swarm_contracts.events import Released
    from swarm_trainer.attempt import PAUSE_REASON, Attempt

    agent = await bare_agent(settings)
    s = Subjects(settings.namespace)
    job = make_assignment(open_store(settings), tiny_model_dir, worker_id="w-test")
    job = job.model_copy(update={"attempt_token": "t0ken"})
    record = await record_job(
        agent,
        job,
        JobState.running,
        1,
        "w-test",
        attempt_token_sha256=token_digest("t0ken"),
        pause_requested=True,
    )
    sub = await agent.broker.connection.subscribe(s.worker_event("w-test", job.job_id, "released"))

    async def setting_up() -> None:  # a run Ray is still starting: no step trained
        await asyncio.sleep(60)

    active = Attempt(agent, job)
    active.task = asyncio.create_task(setting_up())
    agent.active[job.job_id] = active
    await active.stop_if_superseded()
    assert active.release_reason == PAUSE_REASON
    assert not active.cancel_requested
    released = Released.model_validate(json.loads((await sub.next_msg(timeout=10)).data)["data"])
    assert (released.attempt, released.reason, released.last_checkpoint_step) == (
        1,
        PAUSE_REASON,
        None,
    )
    for _ in range(50):  # let go (just after the event went out): the worker is free
        if job.job_id not in agent.active:
            break
        await asyncio.sleep(0.1)
    assert job.job_id not in agent.active
    active.task.cancel()

    # An assignment whose record already asks for the pause is taken, to be handed back.
    fresh = job.model_copy(update={"attempt": 2})
    placed = record.model_copy(update={"attempt": 2, "state": JobState.assigned})
    await agent.jobs.put(job.job_id, placed)
    assert await agent.accept(fresh)
    taken = agent.active[job.job_id]
    assert taken.release_reason == PAUSE_REASON
    assert taken.task is not None
    taken.task.cancel()  # no Ray run in this test
    await agent.broker.stop()

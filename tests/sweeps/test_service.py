"""The sweeps service over HTTP, with no trainer: trials as jobs of the sweep's tenant,
idempotent creation, tenant scoping, cancellation of every trial, and the event stream."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from swarm import AsyncClient, NotFoundError, ValidationError
from swarm_contracts.jobs import JobState
from swarm_contracts.sweeps import SweepState, TrialState, sweep_id_for, trial_job_id

from .conftest import ADMIN, ALICE, BOB, ControlStack


def sweep_spec(dataset: str, **overrides: Any) -> dict[str, Any]:
    return {
        "name": "lr-search",
        "base": {"base_model": "tiny", "dataset": dataset, "training": {"max_steps": 4}},
        "algorithm": "random",
        "search": {
            "training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-2},
            "lora.target_modules": {"type": "choice", "values": [["q_proj"], "all-linear"]},
        },
        "budget": 5,
        "max_concurrent": 2,
    } | overrides


async def until(check: Any, timeout: float = 20.0) -> Any:
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(0.1)
        return found


async def test_a_sweep_runs_its_trials_as_jobs_of_its_tenant_and_cancels_them(
    control_stack: ControlStack,
) -> None:
    url = control_stack.url
    async with (
        AsyncClient(url, api_key=ALICE) as alice,
        AsyncClient(url, api_key=BOB) as bob,
        AsyncClient(url, api_key=ADMIN) as admin,
    ):
        spec = sweep_spec(control_stack.dataset)
        created = await alice.create_sweep(spec, idempotency_key="lr-1")
        assert created.sweep_id == sweep_id_for("alice", "lr-1")
        assert created.state == SweepState.running
        assert created.tenant == "alice"
        # The same key again: the same sweep, not a second one.
        assert (await alice.create_sweep(spec, idempotency_key="lr-1")).sweep_id == created.sweep_id
        sweep_id = created.sweep_id

        # max_concurrent trials in flight, no more (nothing runs them: no trainer).
        async def two_trials() -> Any:
            detail = await alice.get_sweep(sweep_id)
            return detail if len(detail.trials) == 2 else None

        detail = await until(two_trials)
        await asyncio.sleep(2.5)  # a whole check period later: still two
        detail = await alice.get_sweep(sweep_id)
        assert [t.trial for t in detail.trials] == [0, 1]
        for trial in detail.trials:
            assert trial.job_id == trial_job_id("alice", sweep_id, trial.trial)
            assert trial.state == TrialState.queued
            job = await alice.get_job(trial.job_id)
            # An ordinary job of the tenant, named after the sweep, with the trial's params.
            assert job.tenant == "alice"
            assert job.spec.name == "lr-search"
            assert job.sweep is not None
            assert (job.sweep.id, job.sweep.trial) == (
                sweep_id,
                trial.trial,
            )
            assert job.spec.training.lr == trial.params["training.lr"]
            assert job.spec.lora.target_modules == trial.params["lora.target_modules"]
            assert job.spec.training.max_steps == 4  # the base spec's
        listed, _ = await alice.list_jobs(sweep=sweep_id)
        assert sorted(j.job_id for j in listed) == sorted(t.job_id for t in detail.trials)
        assert [s.sweep_id for s in await alice.list_sweeps()] == [sweep_id]

        # Another tenant cannot see, follow or cancel it; an admin can see it.
        assert await bob.list_sweeps() == []
        for attempt in (
            bob.get_sweep(sweep_id),
            bob.cancel_sweep(sweep_id),
            anext(bob.sweep_events(sweep_id)),
        ):
            with pytest.raises(NotFoundError):
                await attempt
        assert (await admin.get_sweep(sweep_id)).tenant == "alice"
        assert [s.sweep_id for s in await admin.list_sweeps(tenant="alice")] == [sweep_id]

        # Cancelling the sweep cancels every trial's job and starts no new trial.
        await alice.cancel_sweep(sweep_id, reason="enough")
        events = [ev async for ev in alice.sweep_events(sweep_id)]  # ends with the sweep
        done = await alice.get_sweep(sweep_id)
        assert done.state == SweepState.cancelled
        assert done.reason == "enough"
        assert [t.state for t in done.trials] == [TrialState.cancelled] * 2
        for trial in done.trials:
            job = await alice.get_job(trial.job_id)
            assert job.state == JobState.cancelled
            assert job.reason == "sweep cancelled"
        names = [e.event for e in events]
        assert names[0] == "created"
        assert names[-1] == "cancelled"
        assert names.count("trial_started") == 2
        assert names.count("trial_finished") == 2
        started = [e.payload for e in events if e.event == "trial_started"]
        assert {s["job_id"] for s in started} == {t.job_id for t in done.trials}
        # A reconnect after the last event ends at once, with nothing repeated.
        assert [e async for e in alice.sweep_events(sweep_id, last_event_id=events[-1].id)] == []


async def test_a_bad_sweep_is_refused_naming_the_field(control_stack: ControlStack) -> None:
    async with httpx.AsyncClient(
        base_url=control_stack.url, headers={"Authorization": f"Bearer {ALICE}"}
    ) as http:
        good = sweep_spec(control_stack.dataset)
        cases = [
            (
                good | {"search": {"training.lr": {"type": "uniform", "low": 0.1, "high": 3}}},
                ["body", "search"],
                "search.training.lr",
            ),
            (
                good | {"base": good["base"] | {"dataset": "ds-" + "0" * 24}},
                ["body", "base", "dataset"],
                "not found for tenant alice",
            ),
            (good | {"budget": 0}, ["body", "budget"], "greater than or equal to 1"),
            (good | {"algorithm": "annealing"}, ["body", "algorithm"], "random"),
        ]
        for body, loc, says in cases:
            resp = await http.post("/v1/sweeps", json=body)
            assert resp.status_code == 422, resp.text
            [error] = [e for e in resp.json()["detail"] if e["loc"] == loc]
            assert says in error["msg"], error
    async with AsyncClient(control_stack.url, api_key=ALICE) as alice:
        with pytest.raises(ValidationError):
            await alice.create_sweep(good | {"max_concurrent": 0})
        assert await alice.list_sweeps() == []

"""Hyperparameter sweeps on the real stack: trials are real training jobs of the tiny model.

The session stack's one trainer agent has 2 CPUs, so two one-CPU trials run at once. Trials
are a few steps long with an evaluation every 2 steps: enough for rungs and a best trial.

Time goes into jobs (each is a Ray Train run): 10 in all. So the three sweeps are created at
once (the ``sweeps`` fixture) and share the trainer's two slots, which then never idle; each
test waits for its own. The restart test comes first: it kills the controller mid-sweep, two
or three of the random sweep's trials started and one still running (its jobs have a higher
priority, but a trial of another sweep may hold a slot already, so two at once is not
certain); the other sweeps go on without a controller too, and must come through it as well.
The sweep on a task metric comes last, and runs alone.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from swarm_contracts.jobs import JobState
from swarm_contracts.sweeps import (
    BEST_ALIAS,
    SweepDetail,
    SweepRecord,
    SweepState,
    TrialRecord,
    TrialState,
)
from swarm_sweeps.searcher import Searcher

from .conftest import Stack, upload_ok_dataset

# The restart test waits for the 4-trial sweep while the others share the trainer: on a busy
# machine that is more than the suite's 600 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
# The random sweep's trials: two running when its controller is killed, at least one to
# propose after the restart.
BUDGET = 4
ASHA_STEPS = 64


def sweep_spec(stack: Stack, name: str, **overrides: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base": {
            "base_model": "tiny-llama",
            "dataset": stack.train.id,
            "validation": stack.validation.id,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
            "training": {
                "max_steps": 4,
                "batch_size": 4,
                "lr": 3e-3,
                "warmup_steps": 0,
                "seq_len": 64,
                "eval_every": 2,
                "checkpoint_every": 100,
            },
        },
        "search": {"training.lr": {"type": "log_uniform", "low": 1e-4, "high": 3e-2}},
        "max_concurrent": 2,
    } | overrides


def cli(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["--url", stack.local.gateway_url, *args], env={"COLUMNS": "200"}
    )
    return result.exit_code, result.output


def names(stack: Stack, sweep_id: str) -> list[str]:
    return [e.event for e in stack.client.sweep_events(sweep_id)]


def never_more_than(events: list[str], limit: int) -> bool:
    """In the order the controller announced them, trials in flight never exceeded ``limit``."""
    in_flight = peak = 0
    for name in events:
        in_flight += {"trial_started": 1, "trial_finished": -1}.get(name, 0)
        peak = max(peak, in_flight)
    return peak == limit


@pytest.fixture(scope="module")
def sweeps(stack: Stack) -> dict[str, SweepRecord]:
    asha_base = sweep_spec(stack, "sweep-asha")["base"]
    # Room for the prune's cancel (the sweeps controller, then the scheduler, then the worker's
    # next step) to land before the pruned trial's job ends: seconds on a loaded machine, which
    # trains the tiny model at tens of steps a second. Only the sane trial runs them all.
    asha_base["training"] |= {"max_steps": ASHA_STEPS}
    random_base = sweep_spec(stack, "sweep-random")["base"] | {"priority": 7}
    specs = {
        # Priority 7 (its trials' jobs go before the others'): the restart test kills the
        # controller while its first two trials run.
        "random": sweep_spec(
            stack, "sweep-random", base=random_base, algorithm="random", budget=BUDGET, seed=7
        ),
        # A grid, one trial at a time: a sane learning rate first, then one too small to learn
        # anything (a too large one is not reliably worse after two steps: it can jump lower).
        "asha": sweep_spec(
            stack,
            "sweep-asha",
            base=asha_base,
            algorithm="grid",
            search={"training.lr": {"type": "choice", "values": [3e-3, 1e-6]}},
            max_concurrent=1,
            early_stopping={"type": "asha", "min_step": 2, "reduction_factor": 2},
        ),
        # One random trial, then TPE proposes the second from its result.
        "bayes": sweep_spec(
            stack, "sweep-bayes", algorithm="bayes", budget=2, startup_trials=1, max_concurrent=1
        ),
    }
    return {
        key: stack.client.create_sweep(spec, idempotency_key=f"e2e-sweep-{key}")
        for key, spec in specs.items()
    }


def test_a_killed_controller_restarts_and_completes_the_sweep_with_exactly_its_budget(
    stack: Stack, sweeps: dict[str, SweepRecord]
) -> None:
    """kill -9 of the sweeps process mid-sweep; a new one takes over from KV and the streams."""
    client, local = stack.client, stack.local
    sweep = sweeps["random"]
    # Mid-sweep: two or three trials started, one still running, the last not started yet.
    deadline = time.monotonic() + 300
    while not mid_sweep(client.get_sweep(sweep.sweep_id)):
        assert time.monotonic() < deadline, client.get_sweep(sweep.sweep_id)
        time.sleep(0.2)
    local.procs["sweeps"].kill()  # SIGKILL: no goodbye, the leader lease is left to expire
    local.procs["sweeps"].wait(10)
    # While no controller runs, the trials go on (they are ordinary jobs); one of them ends.
    first = client.get_sweep(sweep.sweep_id).trials  # what the killed controller had started
    assert 2 <= len(first) < BUDGET
    deadline = time.monotonic() + 300
    while not (ended := [t.trial for t in first if client.get_job(t.job_id).state.terminal]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    local.start_service("sweeps")

    done = client.wait_sweep(sweep.sweep_id, timeout=600)
    assert done.state == SweepState.completed, done.reason
    assert [t.trial for t in done.trials] == list(range(BUDGET))
    assert [t.state for t in done.trials] == [TrialState.succeeded] * BUDGET
    # Exactly the budget: one job per trial, one adapter version per job.
    jobs, _ = client.list_jobs(sweep=sweep.sweep_id, limit=100)
    assert sorted(j.job_id for j in jobs) == sorted(t.job_id for t in done.trials)
    assert len(client.list_adapters("sweep-random")) == BUDGET
    # The new leader caught up with the trials' jobs before proposing: the first trial it
    # proposed knew what had ended while no controller ran.
    assert set(ended) <= set(done.trials[len(first)].told)
    events = names(stack, sweep.sweep_id)
    assert events.count("trial_started") == BUDGET
    assert events.count("trial_finished") == BUDGET
    assert events.count("completed") == 1
    assert events.count("created") == 1


def mid_sweep(sweep: SweepDetail) -> bool:
    return 2 <= len(sweep.trials) < BUDGET and any(
        t.state == TrialState.running for t in sweep.trials
    )


def test_a_random_sweep_runs_its_budget_two_at_a_time_and_aliases_the_best(
    stack: Stack, sweeps: dict[str, SweepRecord], tmp_path: Path
) -> None:
    client = stack.client
    sweep = sweeps["random"]
    done = client.wait_sweep(sweep.sweep_id, timeout=600)
    assert done.state == SweepState.completed, done.reason
    assert [t.trial for t in done.trials] == list(range(BUDGET))
    assert {t.state for t in done.trials} == {TrialState.succeeded}

    # Each trial's value is its job's final eval loss; the best is the lowest of them.
    for trial in done.trials:
        job = client.get_job(trial.job_id)
        assert job.state == JobState.succeeded
        assert job.sweep is not None
        assert trial.value == pytest.approx(job.metrics["eval_loss"])
        assert trial.evals
        assert max(trial.evals) == 4
        assert job.spec.training.lr == trial.params["training.lr"]
    best = min(done.trials, key=lambda t: t.value or math.inf)
    assert done.best is not None
    assert done.best.trial == best.trial
    assert done.best.adapter is not None
    assert done.best.adapter == best.adapter
    assert len({t.params["training.lr"] for t in done.trials}) == BUDGET

    # Every trial registered a version of the sweep's adapter; the best one has the alias.
    versions = {a.version for a in client.list_adapters("sweep-random")}
    assert versions == {t.adapter.version for t in done.trials if t.adapter}
    assert len(versions) == BUDGET
    alias = client.get_alias("sweep-random", BEST_ALIAS)
    assert alias["version"] == best.adapter.version  # type: ignore[union-attr]

    events = names(stack, sweep.sweep_id)
    assert events[0] == "created"
    assert events[-1] == "completed"
    assert events.count("trial_started") == events.count("trial_finished") == BUDGET
    assert never_more_than(events, 2)
    assert events.count("best_changed") >= 1

    # The CLI: the sweep in the list, its trials table, and the metric plotted by parameter.
    code, output = cli(stack, "sweeps")
    assert code == 0, output
    assert sweep.sweep_id in output, output
    plot = tmp_path / "sweep.png"
    code, output = cli(stack, "sweeps", "show", sweep.sweep_id, "--plot", str(plot))
    assert code == 0, output
    assert f"{best.trial} ★" in output
    # rich may wrap the summary line wherever the terminal ends.
    assert "alias sweep-random@best" in " ".join(output.split())
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert plot.stat().st_size > 10_000


def test_asha_prunes_a_trial_whose_eval_loss_is_clearly_worse(
    stack: Stack, sweeps: dict[str, SweepRecord]
) -> None:
    """A grid, one trial at a time: a sane learning rate runs to the end and sets the rungs;
    a useless one (it learns nothing) is stopped at the first rung and its job cancelled with
    reason "pruned"."""
    client = stack.client
    sweep = sweeps["asha"]
    done = client.wait_sweep(sweep.sweep_id, timeout=300)
    assert done.state == SweepState.completed, done.reason
    sane, absurd = done.trials
    assert sane.params == {"training.lr": 3e-3}
    assert absurd.params == {"training.lr": 1e-6}
    assert sane.state == TrialState.succeeded
    assert max(sane.evals) == ASHA_STEPS
    assert absurd.state == TrialState.pruned, (absurd.evals, sane.evals)
    assert absurd.pruned_at_step == 2
    assert absurd.prune_cutoff == pytest.approx(sane.evals[2])
    assert absurd.evals[2] > sane.evals[2]
    job = client.get_job(absurd.job_id)
    assert job.state == JobState.cancelled
    assert job.reason == "pruned"
    # It registered nothing. (How many of its steps ran before the cancel landed depends on
    # the machine's load: not asserted.)
    assert job.adapter is None
    events = [e for e in client.sweep_events(sweep.sweep_id)]
    [pruned] = [e.payload for e in events if e.event == "trial_pruned"]
    assert (pruned["trial"], pruned["step"]) == (1, 2)
    assert done.best is not None
    assert done.best.trial == 0


def test_bayes_proposes_later_trials_from_earlier_results(
    stack: Stack, sweeps: dict[str, SweepRecord], tmp_path: Path
) -> None:
    client = stack.client
    sweep = sweeps["bayes"]
    # `swarm sweep run --follow` with the sweep's idempotency key attaches to it, shows its
    # trials live and exits 0 once it completed.
    spec_file = tmp_path / "bayes.yaml"
    spec_file.write_text(yaml.safe_dump(sweep.spec.model_dump(mode="json", exclude_none=True)))
    code, output = cli(
        stack, "sweep", "run", str(spec_file), "--follow", "--idempotency-key", "e2e-sweep-bayes"
    )
    assert code == 0, output
    assert f"sweep {sweep.sweep_id}" in output
    assert "best: trial" in output
    done = client.wait_sweep(sweep.sweep_id, timeout=60)
    assert done.state == SweepState.completed, done.reason
    trials = done.trials
    assert [t.state for t in trials] == [TrialState.succeeded] * 2
    # The first trial was proposed with nothing known; the second after it had ended, and the
    # searcher was told its result.
    assert trials[0].told == []
    assert trials[1].told == [0]
    events = [e for e in client.sweep_events(sweep.sweep_id)]
    position = {
        (e.event, e.payload.get("trial")): i
        for i, e in enumerate(events)
        if e.event in ("trial_started", "trial_finished")
    }
    searcher = Searcher(done.spec)
    for trial in trials[1:]:
        assert trial.told, trial
        for m in trial.told:
            assert position[("trial_finished", m)] < position[("trial_started", trial.trial)]
        # What the searcher knew then (the told trials' results; the rest still running)
        # gives exactly the parameters it proposed ...
        known = as_known_then(trials[: trial.trial], trial.told)
        assert searcher.propose(trial.trial, known).params == trial.params
        # ... and without those results it would have proposed something else.
        unknown = as_known_then(trials[: trial.trial], [])
        assert searcher.propose(trial.trial, unknown).params != trial.params


def as_known_then(earlier: list[TrialRecord], told: list[int]) -> list[TrialRecord]:
    return [
        t if t.trial in told else t.model_copy(update={"state": TrialState.running, "evals": {}})
        for t in earlier
    ]


def test_a_sweep_on_a_task_metric_keeps_the_trial_with_the_highest_exact_match(
    stack: Stack, tmp_path: Path
) -> None:
    """The objective is a grader's metric, not the loss: each trial's value is its adapter's
    exact match, and the best is the highest (``mode`` max by default for a task metric). The
    grid's first trial learns nothing (lr 1e-6), so a sweep that kept its first trial, or the
    lowest value, would pick the wrong one. Last in the file: it runs alone on the trainer
    after the other sweeps have completed."""
    client = stack.client
    base = {
        "base_model": "tiny-llama",
        "dataset": upload_ok_dataset(stack, tmp_path),
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "training": {
            "max_steps": 16,
            "batch_size": 8,
            "warmup_steps": 2,
            "seq_len": 32,
            "eval_every": 16,
            "checkpoint_every": 16,
            "val_fraction": 0.0,
        },
        "evals": {
            "fraction": 0.2,
            "graders": [{"type": "exact_match"}],
            "max_new_tokens": 4,
            "samples": 0,
            "select_by": "exact_match",
        },
    }
    spec = sweep_spec(
        stack,
        "sweep-exact",
        base=base,
        algorithm="grid",
        search={"training.lr": {"type": "choice", "values": [1e-6, 1e-2]}},
        metric="exact_match",
    )
    sweep = client.create_sweep(spec, idempotency_key="e2e-sweep-exact")
    assert sweep.spec.mode == "max"
    done = client.wait_sweep(sweep.sweep_id, timeout=300)
    assert done.state == SweepState.completed, done.reason
    still, learner = done.trials
    assert still.params == {"training.lr": 1e-6}
    assert learner.params == {"training.lr": 1e-2}
    assert [t.state for t in done.trials] == [TrialState.succeeded] * 2
    for trial in done.trials:
        job = client.get_job(trial.job_id)
        # The trial's value is the kept adapter's exact match, not its eval loss.
        assert trial.value == pytest.approx(job.metrics["exact_match"])
        assert max(trial.evals) == 16  # and step 0's, the base model's
    assert still.value is not None
    assert learner.value is not None
    assert learner.value >= still.value + 0.5, (still.value, learner.value)
    assert done.best is not None
    assert done.best.trial == learner.trial
    assert done.best.value == learner.value
    alias = client.get_alias("sweep-exact", BEST_ALIAS)
    assert alias["version"] == learner.adapter.version  # type: ignore[union-attr]
    changes = [e.payload for e in client.sweep_events(sweep.sweep_id) if e.event == "best_changed"]
    assert changes[-1]["best"]["trial"] == learner.trial

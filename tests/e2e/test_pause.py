"""Pause, resume and fork through the real stack (gateway, scheduler, registry, telemetry, a
trainer agent with its Ray cluster), with the SDK a script would use.

A job paused mid-run checkpoints the step it reached, frees its worker and holds nothing until
it is resumed; resumed, it ends with the losses and the adapter of the same job run without a
pause, bit for bit (CPU, fp32). A fork that takes the whole training state of that checkpoint
ends the same way, and its lineage names the checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from swarm.client import Client
from swarm.errors import NotFoundError, ValidationError
from swarm_contracts.jobs import JobRecord, JobState, job_id_for
from swarm_runtime.store import LocalStore

from .conftest import Stack

pytestmark = pytest.mark.slow

# A pause asked after the second step lands within a second or two. A step of the tiny model
# takes as little as 20 ms on an idle machine (40 steps once ran out before the pause), so the
# jobs are named slow-…: the e2e trainer sleeps 0.2 s before each of their steps
# (SWARM_TRAINER_TEST_HOOK=slow_named_steps), which leaves the pause 7 s or more however fast
# the machine, and costs no CPU.
STEPS = 40
WORKER = "e2e-worker"


def spec(stack: Stack, **training: object) -> dict:
    return {
        "name": "slow-e2e-paused",
        "base_model": "tiny-llama",
        "dataset": stack.train.id,
        "validation": stack.validation.id,
        # Dropout draws random numbers every step: a resume that did not restore the RNG
        # streams would not match.
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "max_steps": STEPS,
            "batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 2,
            "seq_len": 64,
            "seed": 11,
            "eval_every": STEPS,
            "checkpoint_every": STEPS,
        }
        | training,
    }


def history(stack: Stack, job_id: str) -> list[dict]:
    """The job's events so far: the SSE stream of a job that has not ended goes on, so it is
    read until the gateway has nothing more to send for a moment."""
    out: list[dict] = []
    with (
        httpx.Client(base_url=stack.local.gateway_url) as http,
        http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=3) as r,
    ):
        try:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    out.append(json.loads(line[5:])["data"])
        except httpx.ReadTimeout:  # the history has been sent
            pass
    return out


def until(what: str, check: object, timeout: float = 120.0, poll_s: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():  # type: ignore[operator]
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def losses(client: Client, job_id: str, steps: range) -> dict[int, float]:
    """The job's training loss at each step (telemetry's, from the progress events; the last
    report of a step wins)."""

    def complete() -> dict[int, float] | None:
        found = {p.step: p.loss for p in client.metrics(job_id).train}
        return found if set(steps) <= set(found) else None

    return until(f"the losses of {job_id}", complete, timeout=30, poll_s=0.5)  # type: ignore[return-value]


def adapter_tensors(stack: Stack, record: JobRecord, tmp: Path) -> dict[str, torch.Tensor]:
    assert record.adapter is not None, record.reason
    target = tmp / f"{record.job_id}.safetensors"
    LocalStore(stack.local.store_dir).get_file(
        f"{record.adapter.store_key}/adapter_model.safetensors", target
    )
    return load_file(target)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert a
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_paused_job_frees_its_worker_and_resumes_as_if_it_never_stopped(
    stack: Stack, tmp_path: Path
) -> None:
    client = stack.client
    # The same job twice, side by side (the worker has two CPUs): one runs through, the other
    # is paused and resumed.
    reference = client.submit(spec(stack), "e2e-pause-reference").job_id
    job_id = client.submit(spec(stack), "e2e-pause-paused").job_id
    until("step 2", lambda: client.get_job(job_id).metrics.get("step", 0) >= 2, timeout=300)
    client.pause_job(job_id)
    paused = client.wait_state(job_id, "paused", timeout=60)
    assert paused.state == JobState.paused, f"{paused.state}: the pause came too late"
    assert (paused.worker_id, paused.assigned_at, paused.attempt) == (None, None, 1)
    so_far = history(stack, job_id)
    released = next(e for e in so_far if e["event"] == "released")
    step = released["last_checkpoint_step"]
    assert 2 <= step < STEPS
    paused_event = next(e for e in so_far if e["event"] == "paused")
    assert paused_event["last_checkpoint_step"] == step

    # Its worker holds it no more (the worker table is written every few seconds).
    def worker_free() -> bool:
        worker = next(w for w in client.workers() if w.worker_id == WORKER)
        return all(r.job_id != job_id for r in worker.running)

    until("the worker to let go of the paused job", worker_free, timeout=20, poll_s=0.5)
    with pytest.raises(ValidationError, match="already paused") as again:
        client.pause_job(job_id)
    assert again.value.status_code == 409

    # A fork of the checkpoint it was paused at, with all of its training state (a fork of
    # the weights alone: tests/trainer/test_resume.py).
    ref = f"{job_id}@{step}"
    full = client.submit(
        spec(stack), "e2e-fork-full", from_checkpoint=ref, from_checkpoint_optimizer=True
    ).job_id
    with pytest.raises(ValidationError, match=f"no committed checkpoint at step {step + 1}"):
        client.submit(spec(stack), "e2e-fork-bad", from_checkpoint=f"{job_id}@{step + 1}")
    with pytest.raises(NotFoundError):
        client.submit(spec(stack), "e2e-fork-bad2", from_checkpoint=f"{job_id_for('x', 'y')}@1")
    client.resume_job(job_id)
    # The scheduler takes the resume in from its control stream: queued again soon after.
    until(
        "the resumed job to leave paused",
        lambda: client.get_job(job_id).state != JobState.paused,
        timeout=30,
        poll_s=0.2,
    )
    with pytest.raises(ValidationError, match="not paused") as running:
        client.resume_job(job_id)
    assert running.value.status_code == 409

    records = {j: client.wait(j, timeout=300) for j in (reference, job_id, full)}
    for record in records.values():
        assert record.state == JobState.succeeded, (record.job_id, record.reason)
    assert records[job_id].attempt == 2

    # The paused and resumed job ran the same steps with the same losses as the reference,
    # and ended with the same adapter, bit for bit.
    expected = losses(client, reference, range(1, STEPS + 1))
    assert losses(client, job_id, range(1, STEPS + 1)) == expected
    reference_adapter = adapter_tensors(stack, records[reference], tmp_path)
    assert_same(adapter_tensors(stack, records[job_id], tmp_path), reference_adapter)
    story = [(e.event, e.payload.get("attempt")) for e in client.events(job_id)]
    assert story[story.index(("paused", 1)) + 1] == ("resumed", 1)
    started = [e.payload for e in client.events(job_id) if e.event == "started"]
    assert [e["resumed_from_step"] for e in started] == [0, step]

    # The fork with the optimizer went on from the checkpoint's step: the same run again.
    forked = losses(client, full, range(step + 1, STEPS + 1))
    assert forked == {s: expected[s] for s in forked}
    assert min(forked) == step + 1
    assert_same(adapter_tensors(stack, records[full], tmp_path), reference_adapter)

    # Its lineage names the checkpoint; the lineage graph has it.
    adapter = records[full].adapter
    assert adapter is not None
    lineage = client.get_adapter(adapter.name, adapter.version).lineage
    assert (lineage.forked_from, lineage.parent) == (ref, None)
    graph = client.adapter_lineage(adapter.name, adapter.version)
    assert {
        "source": f"{adapter.name}@{adapter.version}",
        "target": ref,
        "kind": "checkpoint",
    } in graph["edges"]

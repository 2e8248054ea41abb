"""An OpenAI fine-tuning script, run against Swarm with only ``base_url`` and ``api_key``
changed: the stock ``openai`` package and nothing else talks to the stack. A second gateway
with two tenants' keys runs on the stack's NATS, registry, scheduler, trainer and inference
worker (the session stack's gateway has auth off)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ..conftest import ServerThread
from .conftest import Stack

pytestmark = pytest.mark.slow

WORDS = ("cat", "dog", "sun", "moon", "tree", "bird", "fish", "rain")


def chat_jsonl(n: int) -> bytes:
    """OpenAI's chat format, as a script would upload it."""
    rows = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "Reverse the word."},
                    {"role": "user", "content": word},
                    {"role": "assistant", "content": word[::-1]},
                ]
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def preference_jsonl(n: int) -> bytes:
    """OpenAI's DPO format: the reversed word preferred over the word as it is."""
    rows = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        rows.append(
            {
                "input": {"messages": [{"role": "user", "content": word}]},
                "preferred_output": [{"role": "assistant", "content": word[::-1]}],
                "non_preferred_output": [{"role": "assistant", "content": word}],
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def clients(stack: Stack) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    from swarm_gateway.app import create_app
    from swarm_gateway.settings import GatewaySettings

    settings = GatewaySettings(
        nats_url=stack.local.nats_url,
        namespace=stack.namespace,
        store_url=stack.local.store_dir.as_uri(),
        api_keys="ft-alice=alice,ft-bob=bob",
    )
    with ServerThread(create_app(settings)) as gateway:
        yield (
            openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="ft-alice", max_retries=0),
            openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="ft-bob", max_retries=0),
        )


def wait_for(client: openai.OpenAI, job_id: str, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(1.0)
    raise TimeoutError(f"{job_id} did not finish")


def test_a_supervised_job_from_upload_to_chat(
    clients: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    alice, bob = clients
    training = alice.files.create(file=("train.jsonl", chat_jsonl(8)), purpose="fine-tune")
    assert training.purpose == "fine-tune"

    job = alice.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=training.id,
        suffix="e2e-reverse",
        seed=3,
        metadata={"script": "e2e"},
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 5}
            },
        },
    )
    # A second job, cancelled while it waits behind the first.
    other = alice.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id)
    alice.fine_tuning.jobs.cancel(other.id)

    # Another tenant sees none of it.
    with pytest.raises(openai.NotFoundError):
        bob.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.BadRequestError):
        bob.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id)

    # Events while it runs, then every page once it has ended.
    seen: set[str] = set()
    deadline = time.monotonic() + 300
    while not any(m.startswith("Job succeeded") or "failed" in m for m in seen):
        assert time.monotonic() < deadline, seen
        seen |= {e.message for e in alice.fine_tuning.jobs.list_events(job.id, limit=5).data}
        time.sleep(1.0)
    done = wait_for(alice, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model is not None
    assert done.fine_tuned_model.startswith("e2e-reverse@")
    assert done.trained_tokens is not None
    assert done.trained_tokens > 0
    assert done.hyperparameters.n_epochs == 2
    assert done.metadata == {"script": "e2e"}

    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=3))
    steps = [e.data["step"] for e in events if e.type == "metrics" and "train_loss" in e.data]  # type: ignore[operator,index]
    assert steps == [4, 3, 2, 1]  # 8 examples, batches of 4, 2 epochs; newest first

    checkpoints = alice.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [4, 2]  # one per epoch
    assert checkpoints.data[0].metrics.train_loss is not None

    results = alice.files.content(done.result_files[0]).text
    assert (
        results.splitlines()[0]
        == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"
    )
    assert len(results.splitlines()) == 5

    # The fine-tuned model answers at once, under the name the job reported.
    assert alice.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model
    answer = alice.chat.completions.create(
        model=done.fine_tuned_model,
        messages=[{"role": "user", "content": "moon"}],
        max_tokens=4,
        seed=1,
    )
    assert answer.model == done.fine_tuned_model
    assert answer.choices[0].message.content is not None

    cancelled = wait_for(alice, other.id, timeout=60)
    assert cancelled.status == "cancelled"
    listed = [j.id for j in alice.fine_tuning.jobs.list(metadata={"script": "e2e"})]
    assert listed == [job.id]


def test_a_dpo_job_from_upload_to_chat(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    """OpenAI's DPO method through the stock client: a Swarm DPO job, trained on the stack's
    trainer, whose model answers at once; its steps' metrics are OpenAI's events."""
    alice, _ = clients
    pairs = alice.files.create(file=("pairs.jsonl", preference_jsonl(8)), purpose="fine-tune")
    job = alice.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=pairs.id,
        suffix="e2e-dpo",
        seed=3,
        method={
            "type": "dpo",
            "dpo": {"hyperparameters": {"beta": 0.5, "n_epochs": 1, "batch_size": 4}},
        },
    )
    assert job.method is not None
    assert job.method.type == "dpo"
    done = wait_for(alice, job.id)
    assert done.status == "succeeded", done.error
    assert done.method is not None
    assert done.method.dpo is not None
    assert done.method.dpo.hyperparameters is not None
    assert done.method.dpo.hyperparameters.beta == 0.5
    assert done.fine_tuned_model is not None
    assert done.fine_tuned_model.startswith("e2e-dpo@")
    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=10))
    steps = [e.data["step"] for e in events if e.type == "metrics" and "train_loss" in e.data]  # type: ignore[operator,index]
    assert steps == [2, 1]  # 8 pairs, batches of 4, one epoch
    answer = alice.chat.completions.create(
        model=done.fine_tuned_model,
        messages=[{"role": "user", "content": "moon"}],
        max_tokens=4,
        seed=1,
    )
    assert answer.model == done.fine_tuned_model


def test_documented_errors(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    alice, _ = clients
    with pytest.raises(openai.BadRequestError) as bad_file:
        alice.files.create(file=("bad.jsonl", b'{"messages": []}\n'), purpose="fine-tune")
    assert bad_file.value.code == "invalid_file_format"
    assert "line 1" in bad_file.value.message

    training = alice.files.create(file=("train.jsonl", chat_jsonl(4)), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as unknown:
        alice.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=training.id)
    assert (unknown.value.code, unknown.value.param) == ("model_not_available", "model")
    with pytest.raises(openai.BadRequestError) as hyper:
        alice.fine_tuning.jobs.create(
            model="tiny-llama", training_file=training.id, hyperparameters={"n_epochs": "many"}
        )
    assert hyper.value.param == "hyperparameters.n_epochs"
    with pytest.raises(openai.BadRequestError) as not_pairs:
        alice.fine_tuning.jobs.create(
            model="tiny-llama", training_file=training.id, method={"type": "dpo"}
        )
    assert (not_pairs.value.code, not_pairs.value.param) == (
        "invalid_training_file",
        "training_file",
    )
    assert "a dpo job needs preference pairs" in not_pairs.value.message
    with pytest.raises(openai.AuthenticationError) as denied:
        openai.OpenAI(base_url=str(alice.base_url), api_key="nobody", max_retries=0).files.list()
    assert isinstance(denied.value.body, dict)
    assert denied.value.body["type"] == "authentication_error"


def test_pause_and_resume_with_the_stock_client(
    clients: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """A running job paused (its worker checkpoints it and lets go), then resumed from that
    checkpoint to its end; another tenant can do neither."""
    alice, bob = clients
    training = alice.files.create(file=("train.jsonl", chat_jsonl(8)), purpose="fine-tune")
    job = alice.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=training.id,
        seed=5,
        # 40 steps of a job named slow-… (its adapter's name, from the suffix): the e2e
        # trainer sleeps 0.2 s before each (tests/e2e/conftest.py), so a pause (a second or two
        # to land) comes before its end even on a machine that trains a step in 20 ms.
        suffix="slow-pause",
        hyperparameters={"n_epochs": 5, "batch_size": 1},
    )

    def trained_a_step() -> bool:
        events = alice.fine_tuning.jobs.list_events(job.id, limit=5).data
        return any(e.type == "metrics" for e in events)

    deadline = time.monotonic() + 300
    while not trained_a_step():
        assert time.monotonic() < deadline, alice.fine_tuning.jobs.retrieve(job.id).status
        time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        bob.fine_tuning.jobs.pause(job.id)
    assert alice.fine_tuning.jobs.pause(job.id).id == job.id
    while (status := alice.fine_tuning.jobs.retrieve(job.id).status) != "paused":
        assert status == "running", f"{status}: the pause came too late"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(openai.ConflictError) as again:
        alice.fine_tuning.jobs.pause(job.id)
    assert again.value.code == "job_not_pausable"
    messages = [e.message for e in alice.fine_tuning.jobs.list_events(job.id, limit=5)]
    assert any(m.startswith("Job paused at the checkpoint of step") for m in messages), messages

    with pytest.raises(openai.NotFoundError):
        bob.fine_tuning.jobs.resume(job.id)
    resumed = alice.fine_tuning.jobs.resume(job.id)
    assert resumed.id == job.id
    done = wait_for(alice, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model is not None
    with pytest.raises(openai.ConflictError) as ended:
        alice.fine_tuning.jobs.resume(job.id)
    assert ended.value.code == "job_not_resumable"
    messages = [e.message for e in alice.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert "Job resumed" in messages

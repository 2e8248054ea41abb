"""The stock ``tinker`` SDK against the real stack (docs/tinker.md): a LoRA training session on
the stack's trainer, driven call by call over the gateway's Tinker API."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
import uuid
from collections.abc import Iterator

import httpx
import nats
import numpy as np
import openai
import pytest
import tinker
import torch
from safetensors.torch import load_file, save_file
from tinker import types

from swarm_contracts.subjects import Subjects

from ..conftest import sample, scrape
from ..tinker_data import TOKENS, datum, logprobs
from .conftest import Stack, inference_worker

pytestmark = pytest.mark.slow

STEPS = 15  # of the RL loop


def _wait_for_the_trainer(stack: Stack) -> None:
    # The stack answers before its trainer (Ray, torch) is up: a session needs one.
    deadline = time.monotonic() + 180
    while not any(w.state == "alive" for w in stack.client.workers()):
        assert time.monotonic() < deadline, "the stack's trainer never came up"
        time.sleep(0.5)


def _wait_for_inference(stack: Stack) -> None:
    # Nor its inference worker (torch, the model): sampling needs one holding tiny-llama.
    deadline = time.monotonic() + 180
    while not any(w.base_models for w in stack.client.inference_workers()):
        assert time.monotonic() < deadline, "the stack's inference worker never came up"
        time.sleep(0.5)


def test_the_stock_sdk_trains_a_lora_session_and_its_state_round_trips(stack: Stack) -> None:
    _wait_for_the_trainer(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=4, seed=0).result(
        timeout=120
    )
    assert training.get_info().lora_rank == 4

    losses = []
    for _ in range(4):
        # Both submitted before either is awaited: the session runs them in order.
        fwd_bwd = training.forward_backward([datum()], "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=1e-2))
        out = fwd_bwd.result(timeout=60)
        step.result(timeout=60)
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(TOKENS) - 1
        losses.append(out.metrics["loss:sum"])
    assert all(b < a for a, b in itertools.pairwise(losses)), losses

    saved = training.save_state("after-4").result(timeout=60).path
    assert saved == f"tinker://{training.model_id}/weights/after-4"
    before = logprobs(training)
    training.forward_backward([datum()], "cross_entropy").result(timeout=60)
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    assert logprobs(training) != before  # the extra step moved the weights

    training.load_state_with_optimizer(saved).result(timeout=60)
    assert logprobs(training) == before  # bit for bit (fp32 on CPU)

    # Bad input is the SDK's error, naming what is wrong; the session goes on.
    with pytest.raises(tinker.BadRequestError, match="loss_fn"):
        training.forward_backward([datum()], "gspo").result(timeout=60)
    with pytest.raises(tinker.RequestFailedError, match="no forward_backward"):
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)
    assert logprobs(training) == before

    # CISPO and DRO through the stock SDK: the loss is Tinker's formula over the worker's
    # log-probabilities (a forward: the weights stay as they are).
    current = np.array(before, dtype=np.float64)
    sampled = (current - np.linspace(-1.0, 1.0, len(current))).astype(np.float32)
    advantages = np.where(np.arange(len(current)) % 2 == 0, 1.0, -0.5).astype(np.float32)
    rl = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(TOKENS[1:], dtype=np.int64),
            "logprobs": sampled,
            "advantages": advantages,
        },
    )
    ratio = np.clip(np.exp(current - sampled), 0.0, 4.0)
    cispo = training.forward([rl], "cispo").result(timeout=60).metrics["loss:sum"]
    assert cispo == pytest.approx(-(ratio * current * advantages).sum(), rel=1e-4)
    dro = training.forward([rl], "dro", {"beta": 0.1}).result(timeout=60).metrics["loss:sum"]
    penalty = 0.05 * (current - sampled) ** 2
    assert dro == pytest.approx(-(current * advantages - penalty).sum(), rel=1e-4)
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_config\.beta"):
        training.forward([rl], "dro").result(timeout=60)

    # Every call's time, and of it the worker's own, in the gateway's metrics.
    scraped = scrape(stack.local.gateway_port)
    calls = "swarm_gateway_tinker_calls_total"
    assert sample(scraped, calls, op="forward_backward", state="done") >= 5
    assert sample(scraped, calls, op="optim_step", state="failed") >= 1
    timed = "swarm_gateway_tinker_call_seconds_count"
    for part in ("total", "compute", "queue"):
        assert sample(scraped, timed, op="optim_step", part=part) >= 4

    # A new training client from the saved state: its weights, with or without its optimizer.
    fresh = service.create_training_client_from_state(saved).result(timeout=120)
    assert fresh.get_info().lora_rank == 4
    assert logprobs(fresh) == before
    resumed = service.create_training_client_from_state_with_optimizer(saved).result(timeout=120)
    assert logprobs(resumed) == before

    # forward_backward_custom: the SDK's forward, the loss's gradient on the client, then a
    # cross_entropy backward weighted by it. A custom loss equal to cross_entropy moves the
    # weights exactly as cross_entropy does, from the same state and optimizer.
    def custom(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
        return -sum(lp.sum() for lp in logprobs), {}

    out = training.forward_backward_custom([datum()], custom).result(timeout=60)
    assert out.metrics["loss:sum"] > 0
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    resumed.forward_backward([datum()], "cross_entropy").result(timeout=60)
    resumed.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    stepped = logprobs(resumed)
    assert logprobs(training) == pytest.approx(stepped, abs=1e-6)
    # Without the optimizer's state, the same step lands elsewhere.
    fresh.forward_backward([datum()], "cross_entropy").result(timeout=60)
    fresh.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    assert logprobs(fresh) != pytest.approx(stepped, abs=1e-6)

    # Closing the session frees its models; the server refuses anything more on them.
    service.close("success").result(timeout=60)
    url, key = stack.local.gateway_url, {"X-API-Key": "tml-local"}
    adam = {"model_id": training.model_id, "seq_id": 999, "adam_params": {}}
    refused = httpx.post(f"{url}/api/v1/optim_step", json=adam, headers=key, timeout=30)
    assert refused.status_code == 409, refused.text
    assert "closed" in refused.json()["detail"]
    session_id = training.model_id.split(":")[0]
    again = {"session_id": session_id, "model_seq_id": 9, "base_model": "tiny-llama"}
    refused = httpx.post(f"{url}/api/v1/create_model", json=again, headers=key, timeout=30)
    assert refused.status_code == 409, refused.text
    assert "finished (success)" in refused.json()["detail"]


def test_the_stock_sdk_samples_its_trained_weights_through_the_inference_service(
    stack: Stack,
) -> None:
    """save_weights_and_get_sampling_client registers the adapter; its samples come from the
    inference workers' engine with the log-probabilities the trainer computes, and the same
    version answers /v1/chat/completions."""
    _wait_for_the_trainer(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=4, seed=1).result(
        timeout=120
    )
    for _ in range(3):  # far enough from the base that base and adapter sample differently
        training.forward_backward([datum()], "cross_entropy").result(timeout=60)
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=60)

    sampler = training.save_weights_and_get_sampling_client().result(timeout=120)
    prompt = types.ModelInput.from_ints(TOKENS[:6])
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
    out = sampler.sample(prompt, num_samples=2, sampling_params=greedy).result(timeout=120)
    assert len(out.sequences) == 2
    tokens = out.sequences[0].tokens
    assert len(tokens) == 8
    assert out.sequences[0].stop_reason == "length"
    assert out.sequences[1].tokens == tokens  # greedy: both samples alike
    # What the trainer's forward says of those tokens after the prompt: the sampler serves
    # the trained weights, not the base model's.
    trained = training.forward([datum(TOKENS[:6] + tokens)], "cross_entropy").result(timeout=60)
    expected = trained.loss_fn_outputs[0]["logprobs"].tolist()[5:]
    assert out.sequences[0].logprobs == pytest.approx(expected, abs=1e-3)
    base = service.create_sampling_client(base_model="tiny-llama").result(timeout=60)
    from_base = base.sample(prompt, num_samples=1, sampling_params=greedy).result(timeout=120)
    assert from_base.sequences[0].logprobs != pytest.approx(expected, abs=1e-3)

    # The prompt's own log-probabilities: what the trainer's forward says of it.
    scored = sampler.compute_logprobs(prompt).result(timeout=120)
    assert scored[0] is None
    prompt_forward = training.forward([datum(TOKENS[:6])], "cross_entropy").result(timeout=60)
    expected_prompt = prompt_forward.loss_fn_outputs[0]["logprobs"].tolist()
    assert scored[1:] == pytest.approx(expected_prompt, abs=1e-3)

    # Seeded samples: several draws, each reproducible.
    seeded = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=[])
    first = sampler.sample(prompt, num_samples=3, sampling_params=seeded).result(timeout=120)
    again = sampler.sample(prompt, num_samples=3, sampling_params=seeded).result(timeout=120)
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert len({tuple(s.tokens) for s in first.sequences}) > 1

    # The registered version is an adapter like a job's: /v1/chat/completions serves it.
    adapter = training.model_id.replace(":", "-")
    oai = openai.OpenAI(base_url=f"{stack.local.gateway_url}/v1", api_key="unused", max_retries=0)
    chat = oai.chat.completions.create(
        model=f"{adapter}@1", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert stack.client.get_adapter(adapter).lineage.dataset == f"tinker:{training.model_id}"

    # Top-k: each prompt position's and each sampled token's 3 likeliest, best first.
    topk = sampler.sample(
        prompt,
        1,
        greedy,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=3,
        topk_sample_logprobs=3,
    ).result(timeout=120)
    assert topk.topk_prompt_logprobs is not None
    assert topk.prompt_logprobs is not None
    assert len(topk.topk_prompt_logprobs) == 6
    assert topk.topk_prompt_logprobs[0] is None
    for token, logprob, top in zip(
        TOKENS[1:6], topk.prompt_logprobs[1:], topk.topk_prompt_logprobs[1:], strict=True
    ):
        assert top is not None
        assert len(top) == 3
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        if token in dict(top):  # the prompt's token among them: its own log-probability
            assert dict(top)[token] == pytest.approx(logprob, abs=1e-5)
    sequence = topk.sequences[0]
    assert sequence.tokens == tokens
    assert sequence.topk_logprobs is not None
    assert sequence.logprobs is not None
    assert len(sequence.topk_logprobs) == len(tokens)
    for token, logprob, top in zip(tokens, sequence.logprobs, sequence.topk_logprobs, strict=True):
        assert top is not None
        assert len(top) == 3
        assert top[0] == (token, pytest.approx(logprob, abs=1e-5))  # greedy: the best one
        assert sum(np.exp(v) for _, v in top) <= 1 + 1e-5

    # Bad input: a clear error naming the field.
    with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs"):
        sampler.sample(prompt, 1, greedy, topk_sample_logprobs=21).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="prompt_logprobs_last_n"):
        sampler.sample(  # past the prompt's 5 scored positions
            prompt, 1, greedy, include_prompt_logprobs=True, prompt_logprobs_last_n=6
        ).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="temperature"):
        sampler.sample(
            prompt, num_samples=1, sampling_params=types.SamplingParams(temperature=9.0)
        ).result(timeout=60)
    with pytest.raises(tinker.NotFoundError, match="model_path"):
        service.create_sampling_client(
            model_path=f"tinker://{training.model_id}/sampler_weights/never-saved"
        ).result(timeout=60)
    service.close("success").result(timeout=60)  # no heartbeats left behind


def test_the_stock_sdk_scores_chosen_ids_and_draws_alternatives_at_each_prompt_position(
    stack: Stack,
) -> None:
    """target_prompt_logprobs, prompt_alt_tokens_k and prompt_logprobs_last_n from the inference
    workers' prefill, checked against the prompt's own log-probabilities (compute_logprobs)."""
    _wait_for_inference(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    sampler = service.create_sampling_client(base_model="tiny-llama").result(timeout=60)
    prompt = types.ModelInput.from_ints(TOKENS[:6])
    own = sampler.compute_logprobs(prompt).result(timeout=120)
    one = types.SamplingParams(max_tokens=1, temperature=1.0, seed=3, stop=[])
    ids = torch.full((5, 2), -1, dtype=torch.int64)
    ids[:, 0] = torch.tensor(TOKENS[1:6])  # each position's own token...
    ids[2, 1] = 7  # ...and another id at one

    def ask() -> types.SampleResponse:
        return sampler.sample(
            prompt,
            1,
            one,
            include_prompt_logprobs=True,
            topk_prompt_logprobs=2,
            prompt_logprobs_last_n=2,
            target_prompt_logprobs=types.TensorData.from_torch(ids),
            prompt_alt_tokens_k=4,
        ).result(timeout=120)

    out = ask()
    target = out.target_prompt_logprobs
    assert target is not None
    assert target.shape == [5, 2]
    scores = target.to_torch()
    assert scores[:, 0].tolist() == pytest.approx(own[1:], abs=1e-5)
    assert scores[2, 1] < 0
    assert scores[[0, 1, 3, 4], 1].tolist() == [0.0] * 4  # the -1 cells
    # The last 2 prompt tokens only (the SDK checks that too).
    assert out.prompt_logprobs is not None
    assert out.prompt_logprobs[:4] == [None] * 4
    assert out.prompt_logprobs[4:] == pytest.approx(own[4:], abs=1e-5)
    assert out.topk_prompt_logprobs is not None
    assert out.topk_prompt_logprobs[:4] == [None] * 4
    assert all(top is not None and len(top) == 2 for top in out.topk_prompt_logprobs[4:])
    # Draws at each position after the first, with the model's log-probabilities of them:
    # what scoring those ids as targets (sparse, at the last position only) answers.
    alt = out.prompt_alt_tokens
    assert alt is not None
    assert alt.tokens.shape == alt.logprobs.shape == [5, 4]
    drawn = alt.tokens.to_torch()
    only_last = torch.full((5, 4), -1, dtype=torch.int64)
    only_last[4] = drawn[4]
    sparse = types.TensorData.from_torch_sparse(only_last, pad_value=-1)
    assert sparse.sparse_crow_indices is not None
    scored = sampler.sample(prompt, 1, one, target_prompt_logprobs=sparse).result(timeout=120)
    assert scored.target_prompt_logprobs is not None
    assert scored.target_prompt_logprobs.sparse_crow_indices == sparse.sparse_crow_indices
    assert scored.target_prompt_logprobs.to_torch()[4].tolist() == pytest.approx(
        alt.logprobs.to_torch()[4].tolist(), abs=1e-5
    )
    again = ask().prompt_alt_tokens
    assert again is not None
    assert torch.equal(again.tokens.to_torch(), drawn)  # seeded: the same draws

    with pytest.raises(tinker.BadRequestError, match="prompt_alt_tokens_k"):
        sampler.sample(prompt, 1, one, prompt_alt_tokens_k=21).result(timeout=60)
    wrong = types.TensorData.from_torch(torch.ones((3, 1), dtype=torch.int64))
    with pytest.raises(tinker.BadRequestError, match="target_prompt_logprobs"):
        sampler.sample(prompt, 1, one, target_prompt_logprobs=wrong).result(timeout=60)
    service.close("success").result(timeout=60)


def _reward(tokens: list[int]) -> float:
    """The toy task: say small token ids (a quarter of the vocabulary)."""
    return sum(t < 128 for t in tokens) / len(tokens)


def test_a_sample_whose_gateway_died_is_run_again_by_the_next(stack: Stack) -> None:
    """A sample is run by the gateway that took it; were that gateway to die, the next one to
    read the future runs it again from the request kept in it (docs/tinker.md, "Gateway
    loss"): here, the future as a dead gateway left it."""
    _wait_for_inference(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    base = service.create_sampling_client(base_model="tiny-llama").result(timeout=60)
    prompt = types.ModelInput.from_ints(TOKENS[:6])
    seeded = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop=[])
    done = base.sample(prompt, num_samples=2, sampling_params=seeded).result(timeout=120)

    async def orphan() -> str:
        """The last sample's future, pending again under a gateway nobody listens on."""
        nc = await nats.connect(stack.local.nats_url)
        try:
            bucket = Subjects(stack.namespace).bucket("tinker_futures")
            kv = await nc.jetstream().key_value(bucket)
            samples = []
            for key in await kv.keys():
                record = json.loads((await kv.get(key)).value or b"{}")
                if record.get("op") == "sample" and record.get("resample"):
                    samples.append(record)
            record = max(samples, key=lambda r: r["sent_at"])
            record |= {
                "request_id": uuid.uuid4().hex,
                "state": "pending",
                "sample": None,
                "done_at": None,
                "gateway": "_INBOX.svc.gateway.dead",
                "sent_at": time.time() - 5,
            }
            await kv.put(record["request_id"], json.dumps(record).encode())
            return str(record["request_id"])
        finally:
            await nc.close()

    request_id = asyncio.run(orphan())
    url, key = stack.local.gateway_url, {"X-API-Key": "tml-local"}
    for _ in range(10):
        answer = httpx.post(
            f"{url}/api/v1/retrieve_future",
            json={"request_id": request_id},
            headers=key,
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        if answer.headers["content-type"].startswith("application/x-protobuf"):
            break
    else:
        raise AssertionError(f"the orphaned sample was never answered: {answer.text}")
    again = _future_record(stack, request_id)
    assert again["state"] == "done"
    assert again["gateway"] != "_INBOX.svc.gateway.dead"  # adopted
    # The same seeded request, run again: the same draws.
    assert [s["tokens"] for s in again["sample"]["sequences"]] == [s.tokens for s in done.sequences]


def _future_record(stack: Stack, request_id: str) -> dict:
    async def read() -> dict:
        nc = await nats.connect(stack.local.nats_url)
        try:
            bucket = Subjects(stack.namespace).bucket("tinker_futures")
            entry = await (await nc.jetstream().key_value(bucket)).get(request_id)
            return dict(json.loads(entry.value or b"{}"))
        finally:
            await nc.close()

    return asyncio.run(read())


@pytest.fixture(scope="module")
def rl_base(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A base model a policy can move: the tiny random model with its output layer ten times
    stronger. (The tiny model's own logits are nearly flat, and its final norm bounds what a
    LoRA on attention and MLP can do to them: no reward moves by more than a few percent.)"""
    out = tmp_path_factory.mktemp("tiny-rl")
    shutil.copytree(stack.model_dir, out, dirs_exist_ok=True)
    weights = load_file(out / "model.safetensors")
    weights["lm_head.weight"] = weights["lm_head.weight"] * 10
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    stack.client.add_model("tiny-rl", out)
    # Room for 4 rows and 2 waiting: the loop's groups of 16 and 32 samples queue for it.
    with inference_worker(
        stack,
        "e2e-rl",
        "tiny-rl",
        SWARM_INFERENCE_MAX_BATCH_SIZE="4",
        SWARM_INFERENCE_MAX_QUEUE="2",
    ):
        yield "tiny-rl"


def test_an_rl_loop_on_sampled_completions_raises_the_mean_reward(
    stack: Stack, rl_base: str
) -> None:
    """The loop an RL researcher writes: sample from the current weights, score, and train with
    importance_sampling on the sampler's own log-probabilities. The samples are more than the
    inference worker takes at once: they wait their turn rather than fail."""
    _wait_for_the_trainer(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    training = service.create_lora_training_client(base_model=rl_base, rank=8, seed=2).result(
        timeout=120
    )
    prompt = TOKENS[:4]

    def sample(sampler: tinker.SamplingClient, n: int, seed: int) -> list[types.SampledSequence]:
        params = types.SamplingParams(max_tokens=6, temperature=1.0, stop=[], seed=seed)
        out = sampler.sample(types.ModelInput.from_ints(prompt), n, params).result(timeout=120)
        return list(out.sequences)

    def mean_reward() -> float:
        sampler = training.save_weights_and_get_sampling_client().result(timeout=120)
        return float(np.mean([_reward(s.tokens) for s in sample(sampler, 32, 7)]))

    start = mean_reward()
    for step in range(STEPS):
        sampler = training.save_weights_and_get_sampling_client().result(timeout=120)
        group = sample(sampler, 16, 1000 + step)
        rewards = np.array([_reward(s.tokens) for s in group])
        advantages = rewards - rewards.mean()
        pad = len(prompt) - 1  # the prompt's positions carry no loss
        data = []
        for seq, advantage in zip(group, advantages, strict=True):
            assert seq.logprobs is not None
            full = prompt + seq.tokens
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": np.array(full[1:], dtype=np.int64),
                        "logprobs": np.array([0.0] * pad + seq.logprobs, dtype=np.float32),
                        "advantages": np.array(
                            [0.0] * pad + [advantage] * len(seq.tokens), dtype=np.float32
                        ),
                    },
                )
            )
        training.forward_backward(data, "importance_sampling").result(timeout=60)
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=60)
    end = mean_reward()
    assert end > start + 0.4, (start, end)
    service.close("success").result(timeout=60)

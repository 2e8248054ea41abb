"""Serving what Swarm trains: two adapters trained through the stack, answered in one batch by
the inference service, through the gateway's OpenAI-compatible routes, the SDK, the CLI, the
stock ``openai`` client and a plain NATS client; tenants, bad input and a killed worker.

Long because: its tests share the costly part, two adapters trained through one stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import nats
import openai
import pytest
import torch
from typer.testing import CliRunner

from swarm.aio import AsyncClient
from swarm.cli import app as cli_app
from swarm_contracts.inference import GenerateChunk
from swarm_contracts.jobs import JobState

from ..conftest import ServerThread, sample, scrape
from .conftest import INFERENCE_WORKER, Stack, inference_worker

pytestmark = pytest.mark.slow

PROMPTS = ["reverse moon ->", "add 3 4 ->", "reverse bird ->"]
MAX_TOKENS = 16
ECHO_WORDS = ("cat", "dog", "sun", "moon", "tree", "bird", "fish", "rain", "star", "leaf")


def spec(name: str, dataset: str, lr: float) -> dict:
    return {
        "name": name,
        "base_model": "tiny-llama",
        "dataset": dataset,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "training": {"max_steps": 8, "batch_size": 4, "lr": lr, "seq_len": 48, "eval_every": 8},
        "resources": {"workers": 1, "cpus_per_worker": 1},
    }


def wait_until_served(stack: Stack, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = stack.client.served_models()
        if any(e["id"] == "tiny-llama" and e["served"] for e in entries):
            return
        time.sleep(0.5)
    raise TimeoutError("no inference worker holds tiny-llama")


@pytest.fixture(scope="module")
def served(stack: Stack) -> None:
    wait_until_served(stack)


@pytest.fixture(scope="module")
def adapters(
    stack: Stack, served: None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """``inf-a`` (the demo task) and ``inf-b`` (an echo task), trained at the same time;
    name@1 -> their downloaded PEFT files."""
    root = tmp_path_factory.mktemp("inference-adapters")
    echo = root / "echo.jsonl"
    echo.write_text(
        "".join(
            json.dumps({"prompt": f"reverse {w} ->", "completion": f" {w} {w}"}) + "\n"
            for w in ECHO_WORDS * 4
        )
    )
    client = stack.client
    jobs = [
        client.submit(spec("inf-a", stack.train.id, 3e-3), idempotency_key="inf-a"),
        client.submit(spec("inf-b", client.upload_dataset(echo).id, 1e-2), idempotency_key="inf-b"),
    ]
    found = {}
    for job in jobs:
        record = client.wait(job.job_id, timeout=420)
        assert record.state == JobState.succeeded, record.reason
        assert record.adapter is not None
        ref = f"{record.adapter.name}@{record.adapter.version}"
        client.download_adapter(record.adapter.name, record.adapter.version, root / ref)
        found[ref] = root / ref
    return found


def merged_greedy(stack: Stack, adapter_dir: Path | None, prompts: list[str]) -> list[str]:
    """transformers' generate on the adapter merged into the base model by peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stack.model_dir)
    model = AutoModelForCausalLM.from_pretrained(stack.model_dir, use_safetensors=True)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    answers = []
    for prompt in prompts:
        ids = [tokenizer.bos_token_id, *tokenizer.encode(prompt, add_special_tokens=False)]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0
            )
        answers.append(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True))
    return answers


async def test_two_adapters_batched_together_each_answer_as_their_merged_model(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    port = stack.local.metrics_ports["inference"]
    mixed_before = sample(scrape(port), "swarm_inference_mixed_batch_forwards_total")
    models = ["tiny-llama", *adapters]
    async with AsyncClient(base_url=stack.local.gateway_url) as client:
        answers = await asyncio.gather(
            *(
                client.complete(m, p, max_tokens=MAX_TOKENS, temperature=0)
                for m in models
                for p in PROMPTS
            )
        )
    got = {m: [a.text for a in answers[i * 3 : i * 3 + 3]] for i, m in enumerate(models)}
    # The requests shared forward passes across adapters (one batch, mixed adapters).
    assert sample(scrape(port), "swarm_inference_mixed_batch_forwards_total") > mixed_before
    assert {a.model for a in answers} == {"tiny-llama@1", *adapters}
    assert got["tiny-llama"] == merged_greedy(stack, None, PROMPTS)
    for ref, directory in adapters.items():
        assert got[ref] == merged_greedy(stack, directory, PROMPTS), ref
    assert got["inf-a@1"] != got["inf-b@1"]
    assert got["inf-a@1"] != got["tiny-llama"]


def test_a_stream_says_what_the_whole_answer_says(stack: Stack, adapters: dict[str, Path]) -> None:
    client = stack.client
    messages = [{"role": "user", "content": "reverse star ->"}]
    whole = client.chat("inf-a", messages, max_tokens=12, temperature=0)
    chunks = list(client.chat_stream("inf-a", messages, max_tokens=12, temperature=0))
    assert "".join(c.text for c in chunks) == whole.text
    assert chunks[-1].usage == whole.usage
    assert whole.usage is not None
    assert whole.usage.completion_tokens >= 1
    assert [c.finish_reason for c in chunks if c.finish_reason] == [whole.finish_reason]
    # Sampling with a seed is reproducible, streamed or not.
    seeded = {"max_tokens": 12, "temperature": 0.9, "seed": 42}
    first = client.complete("inf-b", "reverse fish ->", **seeded)
    again = "".join(c.text for c in client.complete_stream("inf-b", "reverse fish ->", **seeded))
    assert first.text == again


def test_the_stock_openai_client_works_unchanged(stack: Stack, adapters: dict[str, Path]) -> None:
    oai = openai.OpenAI(base_url=f"{stack.local.gateway_url}/v1", api_key="unused", max_retries=0)
    ids = {m.id for m in oai.models.list()}
    assert {"tiny-llama", "inf-a", "inf-b"} <= ids

    chat = oai.chat.completions.create(
        model="inf-a",
        messages=[{"role": "user", "content": "reverse moon ->"}],
        max_tokens=10,
        temperature=0,
    )
    expected = stack.client.chat("inf-a", "reverse moon ->", max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == expected.text
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None
    assert chat.usage.total_tokens == expected.usage.total_tokens

    stream = oai.chat.completions.create(
        model="inf-a",
        messages=[{"role": "user", "content": "reverse moon ->"}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == expected.text

    stack.client.set_alias("inf-b", "production", 1)
    text = oai.completions.create(
        model="inf-b@production", prompt="reverse cat ->", max_tokens=8, temperature=0
    )
    assert text.model == "inf-b@1"
    assert (
        text.choices[0].text
        == stack.client.complete("inf-b@1", "reverse cat ->", max_tokens=8, temperature=0).text
    )

    with pytest.raises(openai.NotFoundError) as missing:
        oai.chat.completions.create(
            model="no-such-bot", messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model="inf-a", prompt="x", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="role"):
        oai.chat.completions.create(model="inf-a", messages=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]


JSON_SCHEMA = {
    "type": "object",
    "properties": {"round": {"type": "boolean"}},
    "required": ["round"],
    "additionalProperties": False,
}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_response_format_json_through_the_stock_client(stack: Stack, served: None) -> None:
    """The tiny random model writes no JSON by itself; asked for it, it writes nothing else."""
    oai = openai.OpenAI(base_url=f"{stack.local.gateway_url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Is the moon round? Answer in JSON."}]
    asked = {"model": "tiny-llama", "messages": messages, "max_tokens": 32, "temperature": 0}
    free = oai.chat.completions.create(**asked)
    assert not _parses(free.choices[0].message.content or "")

    json_mode = oai.chat.completions.create(**asked, response_format={"type": "json_object"})
    assert json_mode.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(json_mode.choices[0].message.content or ""), dict)

    schema_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": JSON_SCHEMA, "strict": True},
    }
    whole = oai.chat.completions.create(**asked, response_format=schema_format)
    jsonschema.validate(json.loads(whole.choices[0].message.content or ""), JSON_SCHEMA)
    stream = oai.chat.completions.create(**asked, response_format=schema_format, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole.choices[0].message.content

    sampled = oai.completions.create(
        model="tiny-llama",
        prompt="moon ->",
        max_tokens=32,
        temperature=1.0,
        seed=3,
        extra_body={"response_format": schema_format},
    )
    jsonschema.validate(json.loads(sampled.choices[0].text), JSON_SCHEMA)

    with pytest.raises(openai.BadRequestError) as unusable:
        oai.chat.completions.create(
            **asked,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 7}},
            },  # type: ignore[typeddict-item]
        )
    assert unusable.value.code == "invalid_request"
    assert "JSON schema" in unusable.value.message


def test_bad_requests_get_a_4xx_in_openais_error_shape(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    url = stack.local.gateway_url
    chat = f"{url}/v1/chat/completions"
    hello = [{"role": "user", "content": "hello"}]
    cases = [
        (chat, {"model": "nope", "messages": hello}, 404, "model"),
        (chat, {"model": "inf-a@7", "messages": hello}, 404, "model"),
        (chat, {"model": "inf-a", "messages": hello, "max_tokens": 5000}, 400, "max_tokens"),
        (chat, {"model": "inf-a", "messages": "hello"}, 400, "messages"),
        (chat, {"model": "inf-a", "messages": []}, 400, "messages"),
        (chat, {"model": "inf-a", "messages": [{"role": "user"}]}, 400, "messages.0.content"),
        (chat, {"model": "inf-a", "messages": [{"content": "x"}]}, 400, "messages.0.role"),
        (chat, {"model": "inf-a", "messages": hello, "n": 2}, 400, "n"),
        (chat, {"messages": hello}, 400, "model"),
        (chat, {"model": "inf-a", "messages": hello, "stop": ["a"] * 5}, 400, "stop"),
        (chat, {"model": "inf-a", "messages": hello, "temperature": 3}, 400, "temperature"),
        (f"{url}/v1/completions", {"model": "inf-a", "prompt": ["a", "b"]}, 400, "prompt"),
        (f"{url}/v1/completions", {"model": "inf-a", "prompt": "x " * 600}, 400, None),
    ]
    for endpoint, body, status, param in cases:
        resp = httpx.post(endpoint, json=body, timeout=30)
        assert resp.status_code == status, (body, resp.text)
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
        assert error["param"] == param, (body, error)
    resp = httpx.post(
        f"{url}/v1/completions", json={"model": "inf-a", "prompt": "x " * 600}, timeout=30
    )
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_another_tenants_adapter_is_not_found(stack: Stack, adapters: dict[str, Path]) -> None:
    """A second gateway with API keys, on the same NATS, registry and inference worker."""
    from swarm_gateway.app import create_app
    from swarm_gateway.settings import GatewaySettings

    settings = GatewaySettings(
        nats_url=stack.local.nats_url,
        namespace=stack.namespace,
        store_url=stack.local.store_dir.as_uri(),
        api_keys="alice-key=alice,owner-key=default",
    )
    with ServerThread(create_app(settings)) as gateway:
        body = {"model": "inf-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        alice = httpx.Client(base_url=gateway.url, headers={"Authorization": "Bearer alice-key"})
        owner = httpx.Client(base_url=gateway.url, headers={"Authorization": "Bearer owner-key"})
        with alice, owner:
            denied = alice.post("/v1/chat/completions", json=body, timeout=30)
            assert denied.status_code == 404
            assert denied.json()["error"]["code"] == "model_not_found"
            assert owner.post("/v1/chat/completions", json=body, timeout=30).status_code == 200
            # Base models are shared; adapters are listed to their tenant only.
            listed = {m["id"] for m in alice.get("/v1/models").json()["data"]}
            assert "tiny-llama" in listed
            assert "inf-a" not in listed
            assert "inf-a" in {m["id"] for m in owner.get("/v1/models").json()["data"]}
            unauthenticated = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
            assert unauthenticated.status_code == 401
            assert unauthenticated.json()["error"]["type"] == "authentication_error"


async def test_a_plain_nats_client_asks_the_inference_worker(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    """docs/events.md's promise: inference without the gateway, and tenants hold there too."""
    nc = await nats.connect(stack.local.nats_url)
    subject = f"{stack.namespace}.swarm.inference.tiny-llama.1.generate"
    request = {
        "request_id": "plain-1",
        "tenant": "default",
        "base_model": "tiny-llama",
        "base_model_version": 1,
        "adapter": "inf-a",
        "prompt": "reverse moon ->",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": False,
    }
    reply = json.loads((await nc.request(subject, json.dumps(request).encode(), timeout=30)).data)
    assert reply["model"] == "inf-a@1"
    assert reply["worker_id"] == INFERENCE_WORKER
    assert [reply["text"]] == merged_greedy(stack, adapters["inf-a@1"], ["reverse moon ->"])
    foreign = request | {"request_id": "plain-2", "tenant": "mallory"}
    reply = json.loads((await nc.request(subject, json.dumps(foreign).encode(), timeout=30)).data)
    assert reply["error"]["code"] == "model_not_found"
    assert reply["error"]["status"] == 404
    malformed = await nc.request(subject, b'{"request_id": "plain-3"}', timeout=30)
    assert json.loads(malformed.data)["ok"] is False  # dead-lettered, answered, still serving
    reply = json.loads((await nc.request(subject, json.dumps(request).encode(), timeout=30)).data)
    assert reply["text"]
    await nc.close()


def test_swarm_chat_answers_once_or_streams(stack: Stack, adapters: dict[str, Path]) -> None:
    runner = CliRunner()
    args = ["--url", stack.local.gateway_url, "chat", "inf-a", "-p", "reverse moon ->"]
    options = ["--max-tokens", "10", "--temperature", "0"]
    expected = stack.client.chat("inf-a", "reverse moon ->", max_tokens=10, temperature=0)
    result = runner.invoke(cli_app, [*args, *options, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["text"] == expected.text
    assert answer["model"] == "inf-a@1"
    result = runner.invoke(cli_app, [*args, *options])
    assert result.exit_code == 0
    assert result.output == expected.text + "\n"
    # Interactive: two turns, the second with the first in its context.
    result = runner.invoke(
        cli_app,
        ["--url", stack.local.gateway_url, "chat", "inf-a", *options],
        input="reverse moon ->\nadd 1 2 ->\n/exit\n",
    )
    assert result.exit_code == 0
    assert expected.text in result.output
    result = runner.invoke(cli_app, ["--url", stack.local.gateway_url, "chat", "nope", "-p", "x"])
    assert result.exit_code == 2
    assert "does not exist" in result.output


# --- a worker killed mid-request ------------------------------------------------------------

VICTIM = "e2e-victim"


def victim_worker(stack: Stack) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """A second inference worker for tiny-llama, as its own process (so it can be killed)."""
    return inference_worker(stack, VICTIM, "tiny-llama")


async def _accepted_by(nc: nats.NATS, worker: str) -> asyncio.Event:
    """Set when ``worker`` accepts a request (seen on the reply inboxes)."""
    seen = asyncio.Event()

    async def watch(msg: nats.aio.msg.Msg) -> None:
        with contextlib.suppress(ValueError):
            chunk = GenerateChunk.model_validate_json(msg.data)
            if chunk.worker_id == worker and chunk.kind == "accepted":
                seen.set()

    await nc.subscribe("_INBOX.>", cb=watch)
    return seen


async def test_a_worker_killed_mid_request_never_leaves_its_caller_hanging(
    stack: Stack, served: None
) -> None:
    # The base model, greedy: it runs to max_tokens (no EOS), long enough to be cut short.
    model, prompt, long = "tiny-llama", "reverse moon ->", 300
    expected = stack.client.complete(model, prompt, max_tokens=long, temperature=0)
    assert expected.finish_reason == "length"
    idle = 4.0  # SWARM_INFERENCE_IDLE_TIMEOUT_S of the stack
    nc = await nats.connect(stack.local.nats_url)
    try:
        with victim_worker(stack) as victim:
            # Streamed, and the victim freezes (SIGSTOP: a hung machine, a cut network):
            # text already reached the caller, so the stream ends with a clean error once
            # the keepalives stop, and the worker is told to drop the request.
            body = {"model": model, "prompt": prompt, "max_tokens": long, "temperature": 0}
            async with httpx.AsyncClient(base_url=stack.local.gateway_url, timeout=60) as http:
                for _ in range(20):  # the queue group picks a worker at random
                    async with http.stream(
                        "POST", "/v1/completions", json=body | {"stream": True}
                    ) as resp:
                        assert resp.status_code == 200
                        if resp.headers["x-swarm-worker"] != VICTIM:
                            continue
                        os.kill(victim.pid, signal.SIGSTOP)
                        started = time.monotonic()
                        lines = [line async for line in resp.aiter_lines() if line]
                        assert time.monotonic() - started < idle + 20
                    error = json.loads(lines[-1][len("data: ") :])["error"]
                    assert error["code"] == "worker_lost"
                    assert "cut short" in error["message"]
                    break
                else:
                    pytest.fail("the victim worker never got a request")
            os.kill(victim.pid, signal.SIGCONT)

            # Not streamed, and the victim is killed (kill -9): the caller has seen nothing,
            # so the gateway starts the request again on the other worker.
            accepted = await _accepted_by(nc, VICTIM)
            async with AsyncClient(base_url=stack.local.gateway_url) as client:
                for _ in range(20):
                    accepted.clear()
                    call = asyncio.create_task(
                        client.complete(model, prompt, max_tokens=long, temperature=0)
                    )
                    waiter = asyncio.create_task(accepted.wait())
                    done, _ = await asyncio.wait(
                        [call, waiter], return_when=asyncio.FIRST_COMPLETED
                    )
                    waiter.cancel()
                    if call in done:
                        continue  # the session's worker took it
                    os.kill(victim.pid, signal.SIGKILL)
                    started = time.monotonic()
                    answer = await asyncio.wait_for(call, timeout=3 * idle + 30)
                    assert time.monotonic() - started < 3 * idle + 30
                    assert answer.text == expected.text
                    assert answer.worker == INFERENCE_WORKER
                    break
                else:
                    pytest.fail("the victim worker never got a request")
        # The survivor still answers.
        again = stack.client.complete(model, prompt, max_tokens=8, temperature=0)
        assert again.worker == INFERENCE_WORKER
        assert expected.text.startswith(again.text)
    finally:
        await nc.close()

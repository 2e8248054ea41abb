"""Log-probabilities of alternatives through the stock ``openai`` client, on the stack's base
model (docs/openai.md#log-probabilities): its parsed types carry OpenAI's shapes, streamed or
not, and out-of-range values are a 400 naming the field."""

from __future__ import annotations

import math
import time
from typing import Any

import openai
import pytest

from .conftest import Stack

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "reverse moon ->"}]


@pytest.fixture(scope="module")
def oai(stack: Stack) -> openai.OpenAI:
    deadline = time.monotonic() + 90
    while not any(e["id"] == "tiny-llama" and e["served"] for e in stack.client.served_models()):
        assert time.monotonic() < deadline, "no inference worker holds tiny-llama"
        time.sleep(0.5)
    return openai.OpenAI(base_url=f"{stack.local.gateway_url}/v1", api_key="unused", max_retries=0)


def test_chat_logprobs_streamed_or_not(oai: openai.OpenAI) -> None:
    asked: dict[str, Any] = {
        "model": "tiny-llama",
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    chat = oai.chat.completions.create(**asked)
    choice = chat.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    content = choice.logprobs.content
    assert chat.usage is not None
    assert len(content) == chat.usage.completion_tokens
    assert "".join(entry.token for entry in content).startswith(choice.message.content or "")
    for entry in content:
        assert entry.logprob <= 0
        assert bytes(entry.bytes or []).decode() == entry.token
        assert len(entry.top_logprobs) == 3
        # Greedy: the best alternative is the token taken, with the same log-probability.
        best = entry.top_logprobs[0]
        assert (best.token, best.logprob) == (entry.token, pytest.approx(entry.logprob))
        scores = [alt.logprob for alt in entry.top_logprobs]
        assert scores == sorted(scores, reverse=True)
        assert sum(math.exp(s) for s in scores) <= 1 + 1e-6

    stream = oai.chat.completions.create(**asked, stream=True)
    streamed = [
        entry
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs is not None
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, pytest.approx(e.logprob)) for e in content
    ]
    assert [len(e.top_logprobs) for e in streamed] == [3] * len(content)


def test_legacy_completion_logprobs(oai: openai.OpenAI) -> None:
    prompt = "reverse cat ->"
    text = oai.completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=5, temperature=0, logprobs=2
    )
    logprobs = text.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens
    assert logprobs.token_logprobs
    assert logprobs.top_logprobs
    assert logprobs.text_offset is not None
    assert logprobs.text_offset[0] == len(prompt)
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert 1 <= len(top) <= 3  # the two likeliest and the chosen one
        assert top[token] == pytest.approx(logprob) == max(top.values())  # greedy
    stream = oai.completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=5, temperature=0, logprobs=2, stream=True
    )
    parts = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    # Each chunk with its own tokens': together, the whole answer's.
    assert [t for part in parts for t in part.tokens or []] == logprobs.tokens
    assert [o for part in parts for o in part.text_offset or []] == logprobs.text_offset


def test_bad_logprobs_values_are_a_400_naming_the_field(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions
    for params, field in (
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=true, as OpenAI
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            chat.create(model="tiny-llama", messages=MESSAGES, max_tokens=2, **params)  # type: ignore[call-overload]
        assert refused.value.param == field
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="tiny-llama", prompt="x", max_tokens=2, logprobs=6)
    assert refused.value.param == "logprobs"

"""A worker's chunks as OpenAI's ``logprobs``, read by the stock ``openai`` package's types
(the e2e tests run them through the stack)."""

from __future__ import annotations

from openai.types.chat.chat_completion import ChoiceLogprobs as ChatLogprobs
from openai.types.completion_choice import Logprobs

from swarm_contracts.inference import GenerateChunk
from swarm_gateway.openai_logprobs import ChoiceLogprobs

TEXTS = {10: " Hi", 11: "é", 12: " there", 13: "!", 14: " you"}
DONE = GenerateChunk(
    request_id="r",
    worker_id="w",
    seq=3,
    kind="done",
    tokens=[10, 11],
    logprobs=[-0.1, -0.7],
    top_logprobs=[[(10, -0.1), (12, -2.5), (13, -3.0)], [(14, -0.6), (11, -0.7), (12, -4.0)]],
    token_texts=TEXTS,
)


def test_chat_logprobs_in_openais_shape() -> None:
    parsed = ChatLogprobs.model_validate(ChoiceLogprobs("chat", 2).of(DONE))
    assert parsed.refusal is None
    assert parsed.content is not None
    first, second = parsed.content
    assert (first.token, first.logprob, first.bytes) == (" Hi", -0.1, list(b" Hi"))
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [(" Hi", -0.1), (" there", -2.5)]
    assert second.bytes == list("é".encode())
    assert [t.token for t in second.top_logprobs] == [" you", "é"]
    none = ChatLogprobs.model_validate(ChoiceLogprobs("chat", 0).of(DONE))
    assert [t.top_logprobs for t in none.content or []] == [[], []]


def test_completion_logprobs_in_openais_shape_streamed_or_not() -> None:
    parsed = Logprobs.model_validate(ChoiceLogprobs("text", 1, offset=7).of(DONE))
    assert parsed.tokens == [" Hi", "é"]
    assert parsed.token_logprobs == [-0.1, -0.7]
    assert parsed.text_offset == [7, 10]
    # The likeliest one and the chosen one (up to logprobs + 1).
    assert parsed.top_logprobs == [{" Hi": -0.1}, {" you": -0.6, "é": -0.7}]
    # Streamed: the text chunk's own token, then the rest with the done chunk.
    stream = ChoiceLogprobs("text", 1, offset=7)
    text = DONE.model_copy(
        update={"kind": "text", "tokens": [10], "logprobs": [-0.1], "top_logprobs": [[(10, -0.1)]]}
    )
    first, rest = stream.of(text), stream.of(DONE)
    assert first is not None
    assert rest is not None
    assert (first["tokens"], rest["tokens"]) == ([" Hi"], ["é"])
    assert (first["text_offset"], rest["text_offset"]) == ([7], [10])
    assert stream.of(DONE.model_copy(update={"kind": "text", "tokens": None})) is None

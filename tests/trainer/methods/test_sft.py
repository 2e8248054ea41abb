"""SFT's data format: what each line format trains on, and truncation."""

from __future__ import annotations

from typing import Any

import pytest

from swarm_trainer.data import IGNORE_INDEX, DatasetError
from swarm_trainer.methods.sft import encode_example, tokenize


def test_prompt_tokens_are_masked(tokenizer: Any) -> None:
    prompt, completion = "Question: what is 2 plus 2? Answer:", " 4."
    e = encode_example({"prompt": prompt, "completion": completion}, tokenizer, 256)
    assert e is not None
    n_prompt = len(tokenizer.encode(prompt, add_special_tokens=False))
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    # bos + prompt are context, completion + eos are targets.
    assert e.labels[: 1 + n_prompt] == [IGNORE_INDEX] * (1 + n_prompt)
    assert e.labels[1 + n_prompt :] == [*completion_ids, tokenizer.eos_token_id]
    assert e.input_ids[1 + n_prompt :] == e.labels[1 + n_prompt :]


def test_text_trains_on_everything_and_chat_on_assistant_only(tokenizer: Any) -> None:
    e = encode_example({"text": "hello world"}, tokenizer, 256)
    assert e is not None
    assert e.labels[1:] == e.input_ids[1:]
    chat = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    c = encode_example(chat, tokenizer, 256)
    assert c is not None
    targets = [t for t in c.labels if t != IGNORE_INDEX]
    answer = tokenizer.encode("hello\n", add_special_tokens=False)
    assert targets == [*answer, tokenizer.eos_token_id]


def test_truncation_and_fully_masked_examples_dropped(tokenizer: Any) -> None:
    long = {"prompt": "word " * 100, "completion": " end"}
    assert encode_example(long, tokenizer, 16) is None  # nothing to learn once truncated
    e = encode_example({"text": "word " * 100}, tokenizer, 16)
    assert e is not None
    assert len(e.input_ids) == 16 == len(e.labels)
    with pytest.raises(DatasetError):
        tokenize([long], tokenizer, 16)
    with pytest.raises(DatasetError, match="unsupported"):
        encode_example({"foo": 1}, tokenizer, 16)

"""The pretrained tiny model: Swarm's own training step on the generated corpus, one token per
character, the same weights from the same seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from swarm_trainer import step
from swarm_trainer.synthetic import corpus
from swarm_trainer.tiny_model import (
    PRETRAIN_THREADS,
    build_char_tokenizer,
    create_pretrained_model,
)


def test_the_corpus_is_deterministic_and_has_no_json() -> None:
    assert corpus(200, seed=3) == corpus(200, seed=3)
    assert corpus(200, seed=3) != corpus(200, seed=4)
    assert not any('{"' in line for line in corpus(2000, seed=0))


def test_the_tokenizer_has_one_token_per_character() -> None:
    tok = build_char_tokenizer()
    text = 'ada is 36 {"x"}'
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_pretraining_is_deterministic_from_its_seed(tmp_path: Path) -> None:
    a = create_pretrained_model(tmp_path / "a", seed=1, steps=4, log=False)
    b = create_pretrained_model(tmp_path / "b", seed=1, steps=4, log=False)
    c = create_pretrained_model(tmp_path / "c", seed=2, steps=4, log=False)
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_pretraining_steps_on_one_thread_and_gives_the_callers_count_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads spin-waiting on a busy 2-core machine made a 2-minute build take an hour."""
    threads: list[int] = []
    real = step.train_step

    def counting(*args: Any, **kwargs: Any) -> Any:
        threads.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", counting)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        create_pretrained_model(tmp_path, seed=1, steps=2, log=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert threads == [PRETRAIN_THREADS] * 2 == [1, 1]

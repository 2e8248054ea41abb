"""The pretrained tiny model: Swarm's own training step on the generated corpus, one token per
character, the same weights from the same seed."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from swarm_trainer.synthetic import corpus
from swarm_trainer.tiny_model import build_char_tokenizer, create_pretrained_model


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

"""``swarm models create-tiny``: built once per kind and seed, copied from the cache after."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.tiny_model import create_tiny_model


def test_a_second_call_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert create_tiny_model(tmp_path / "a", random=True) is False
    assert create_tiny_model(tmp_path / "b", random=True) is True
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # Another seed is another model.
    assert create_tiny_model(tmp_path / "c", random=True, seed=1) is False
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != (
        tmp_path / "a" / "model.safetensors"
    ).read_bytes()

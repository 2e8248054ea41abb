"""``name``, ``name@version`` and ``name@alias``: one parser for every artifact reference."""

from __future__ import annotations

import pytest

from swarm_contracts.refs import Ref


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("bot", Ref("bot")),
        ("bot@3", Ref("bot", version=3)),
        ("bot@production", Ref("bot", alias="production")),
        ("tiny-llama@12", Ref("tiny-llama", version=12)),
    ],
)
def test_parse_and_print_round_trip(text: str, ref: Ref) -> None:
    assert Ref.parse(text) == ref
    assert str(ref) == text


@pytest.mark.parametrize("text", ["", "@3", "bot@"])
def test_malformed_refs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="NAME"):
        Ref.parse(text)


def test_a_base_model_ref_takes_no_alias() -> None:
    assert Ref.parse_versioned("tiny@2") == Ref("tiny", version=2)
    with pytest.raises(ValueError, match="NAME@VERSION"):
        Ref.parse_versioned("tiny@latest")

"""response_format on the batching engine: constrained rows (lm-format-enforcer's mask) give
JSON the schema accepts, from a random model that writes no JSON by itself, while free rows
in the same batch are untouched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest

from swarm_generation.sampling import SamplingParams
from swarm_inference.engine import Engine, InvalidRequest
from swarm_inference.json_format import ANY_OBJECT, check_enforceable

# Small enough that the constrained answer always ends (with "stop") within max_tokens.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
PROMPT = "Reply in JSON:"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("seed", [None, 1, 2])
async def test_a_json_schema_request_gives_json_the_schema_accepts(
    engine: Engine, seed: int | None
) -> None:
    ids = engine.encode(PROMPT)
    params = SamplingParams(max_tokens=24, temperature=0 if seed is None else 1.0, seed=seed)
    free = await engine.complete(ids, params)
    assert not _is_json(free.text), "the tiny model should not write JSON by itself"
    constrained = await engine.complete(ids, params, json_schema=SCHEMA)
    assert constrained.finish_reason == "stop"
    jsonschema.validate(json.loads(constrained.text), SCHEMA)


async def test_json_object_gives_an_object(engine: Engine) -> None:
    ids = engine.encode(PROMPT)
    piece = await engine.complete(
        ids, SamplingParams(max_tokens=24, temperature=0), json_schema=ANY_OBJECT
    )
    assert piece.finish_reason == "stop"
    assert isinstance(json.loads(piece.text), dict)


async def test_constrained_and_free_rows_share_a_batch_and_the_free_ones_are_untouched(
    engine: Engine, sources: dict
) -> None:
    ids = engine.encode(PROMPT)
    free_params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    alone = await engine.complete(ids, free_params, sources["all"])
    steps = engine.steps
    free, constrained, other = await asyncio.gather(
        engine.complete(ids, free_params, sources["all"]),
        engine.complete(ids, SamplingParams(max_tokens=24, temperature=0), json_schema=SCHEMA),
        engine.complete(ids, SamplingParams(max_tokens=24, temperature=0), sources["qv"], SCHEMA),
    )
    # One after another they would take this many decode steps or more.
    assert engine.steps - steps < free.completion_tokens + constrained.completion_tokens - 2
    assert free.text == alone.text
    for piece in (constrained, other):
        jsonschema.validate(json.loads(piece.text), SCHEMA)


async def test_a_schema_the_constraint_cannot_use_is_an_invalid_request(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="JSON schema"):
        await engine.complete(
            engine.encode(PROMPT), SamplingParams(max_tokens=4), json_schema={"type": 42}
        )


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "integer", "minimum": 3}, "schema uses 'minimum'"),
        (
            {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}},
            "schema.properties.n uses 'multipleOf'",
        ),
        ({"type": "array", "items": {"anyOf": [{"not": {}}]}}, "schema.items.anyOf[0] uses 'not'"),
        ({"type": "string", "format": "email"}, "schema uses 'format'"),
        ({"type": "object", "properties": {"a": {"type": "foo"}}}, "JSON schema is not valid"),
    ],
)
async def test_a_schema_keyword_that_would_not_be_enforced_is_refused(
    engine: Engine, schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(InvalidRequest, match=where.replace("[", r"\[").replace("]", r"\]")):
        await engine.complete(
            engine.encode(PROMPT), SamplingParams(max_tokens=4), json_schema=schema
        )


def test_a_property_named_like_a_keyword_is_no_keyword() -> None:
    check_enforceable({"type": "object", "properties": {"minimum": {"type": "integer"}}})


async def test_a_constraint_that_fails_mid_answer_fails_its_row_only(
    engine: Engine, sources: dict
) -> None:
    # Valid by the metaschema; the library meets the dangling $ref only at the key "a".
    dangling = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/missing"}},
        "required": ["a"],
    }
    ids = engine.encode(PROMPT)
    free_params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    alone = await engine.complete(ids, free_params, sources["all"])
    free, failed = await asyncio.gather(
        engine.complete(ids, free_params, sources["all"]),
        engine.complete(ids, SamplingParams(max_tokens=24, temperature=0), json_schema=dangling),
        return_exceptions=True,
    )
    assert isinstance(failed, InvalidRequest)
    assert "cannot be followed" in str(failed)
    assert not isinstance(free, BaseException)
    assert free.text == alone.text
    assert free.completion_tokens == 16

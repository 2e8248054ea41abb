"""Constrained decoding to JSON (OpenAI's ``response_format`` ``json_object`` and
``json_schema``), with lm-format-enforcer.

``JsonVocabulary`` is built once per tokenizer (each token's text, in a prefix tree); a
request that asks for JSON gets its own ``JsonConstraint``, which says before each token
which token ids keep the text a prefix of a document the schema accepts (and lets
end-of-sequence through only once the document is complete). The engine masks the other
logits of that row only, so constrained and free rows share a batch.
"""

from __future__ import annotations

import threading
from typing import Any

from jsonschema import SchemaError, validators
from lmformatenforcer import (
    CharacterLevelParserConfig,
    JsonSchemaParser,
    TokenEnforcer,
    TokenEnforcerTokenizerData,
)
from transformers import PreTrainedTokenizerBase

# json_object: any JSON object, as OpenAI's JSON mode (never a bare string or number).
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Whitespace between JSON tokens, at most this many in a row: without a bound a weak model
# spends its tokens on blank lines; two still allow "\n  "-style layouts to start.
MAX_CONSECUTIVE_WHITESPACE = 2


# Keywords lm-format-enforcer accepts but does not enforce: a schema using one is refused,
# since an answer that breaks it would pass for one the schema was applied to.
NOT_ENFORCED = frozenset(
    {
        "format",  # date-time, email, uuid...: a string's format is not checked
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "not",
        "if",
        "then",
        "else",
    }
)
# Where a schema holds further schemas: one, a list of them, or a name -> schema map.
_ONE = ("items", "additionalProperties")
_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_MAPS = ("properties", "$defs", "definitions")


class JsonFormatError(ValueError):
    """A schema the constraint cannot be built from, or cannot enforce."""


def check_schema(schema: dict[str, Any]) -> None:
    """A JSON Schema (by its own metaschema) whose keywords are all enforced, or
    ``JsonFormatError``. lm-format-enforcer meets some mistakes (an unknown ``type``) only
    when generation reaches them, and then ends the text early."""
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise JsonFormatError(f"the JSON schema is not valid: {exc.message}") from exc
    check_enforceable(schema)


def check_enforceable(schema: object, where: str = "schema") -> None:
    """Raise ``JsonFormatError`` naming the first keyword (and where) that would not be
    enforced."""
    if not isinstance(schema, dict):
        return
    unenforced = sorted(NOT_ENFORCED & schema.keys())
    if unenforced:
        raise JsonFormatError(
            f"{where} uses {unenforced[0]!r}, which constrained decoding does not enforce"
        )
    for key in _ONE:
        check_enforceable(schema.get(key), f"{where}.{key}")
    for key in _LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            check_enforceable(sub, f"{where}.{key}[{i}]")
    for key in _MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                check_enforceable(sub, f"{where}.{key}.{name}")


def _regular_tokens(tokenizer: PreTrainedTokenizerBase) -> list[tuple[int, str, bool]]:
    """(id, text, starts a word) of every non-special token. A token's text is decoded
    after a "0" token and that "0" dropped, so that a leading space survives decoding (what
    lm-format-enforcer's transformers integration does; that module does not import with
    transformers 5)."""
    special = set(tokenizer.all_special_ids)
    zero = tokenizer.encode("0", add_special_tokens=False)[-1]
    tokens = []
    for token in range(len(tokenizer)):
        if token in special:
            continue
        after_zero = tokenizer.decode([zero, token])[1:]
        alone = tokenizer.decode([token])
        tokens.append((token, after_zero, len(after_zero) > len(alone)))
    return tokens


class JsonVocabulary:
    """The tokenizer's side of the constraint, built on first use (a pass over the vocabulary:
    seconds for a large one, so callers build it off their event loop)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = sorted(eos_ids)
        self._data: TokenEnforcerTokenizerData | None = None
        self._lock = threading.Lock()

    def data(self) -> TokenEnforcerTokenizerData:
        with self._lock:
            if self._data is None:
                tokenizer = self.tokenizer
                self._data = TokenEnforcerTokenizerData(
                    _regular_tokens(tokenizer),
                    # A token cut inside a UTF-8 character decodes to U+FFFD: not text yet.
                    lambda ids: tokenizer.decode(ids).rstrip("\ufffd"),
                    self.eos_ids,
                    False,
                    len(tokenizer),
                )
            return self._data

    def constraint(self, schema: dict[str, Any]) -> JsonConstraint:
        check_schema(schema)
        data = self.data()
        try:
            parser = JsonSchemaParser(schema)
        except Exception as exc:  # the library raises bare Exceptions for what it lacks
            raise JsonFormatError(f"the JSON schema cannot be used: {exc}") from exc
        enforcer = TokenEnforcer(data, parser)
        # TokenEnforcer sets the parser's config (the alphabet) with the default whitespace
        # bound; replace it with ours.
        parser.config = CharacterLevelParserConfig(
            alphabet=data.tokenizer_alphabet,
            max_consecutive_whitespaces=MAX_CONSECUTIVE_WHITESPACE,
        )
        return JsonConstraint(enforcer, self.eos_ids)


class JsonConstraint:
    """One request's state: the tokens generated so far and what may come next."""

    def __init__(self, enforcer: TokenEnforcer, eos_ids: list[int]) -> None:
        self._enforcer = enforcer
        self._eos_ids = eos_ids
        self._generated: list[int] = []

    def allowed(self) -> list[int]:
        """Token ids allowed next (end-of-sequence among them once the JSON is complete);
        ``JsonFormatError`` where the schema cannot be followed further."""
        try:
            allowed: list[int] = self._enforcer.get_allowed_tokens(self._generated).allowed_tokens
        except Exception as exc:  # the library's own errors, and its bugs
            raise JsonFormatError(f"the JSON schema cannot be followed: {exc}") from exc
        state = self._enforcer.prefix_states[tuple(self._generated)]
        # On an error it does not expect, the library logs it and allows only
        # end-of-sequence, which would end the text as incomplete JSON with "stop".
        if set(allowed) <= set(self._eos_ids) and not state.parser.can_end():
            raise JsonFormatError("the JSON schema cannot be followed past this point")
        return allowed

    def advance(self, token: int) -> None:
        # The enforcer keys its states by the whole sequence so far; one request only ever
        # moves forward, so the state before the last is dropped (else memory grows with
        # the square of the length).
        previous = tuple(self._generated[:-1])
        if self._generated:
            self._enforcer.prefix_states.pop(previous, None)
        self._generated.append(token)

"""Grading generated outputs against expected answers (the graders of ``evals``).

Each grader scores one row 1.0 or 0.0. A grader that raises on a row (an expected answer that
is none of a ``choice``'s options, a schema check that blows up) scores that row 0 and keeps
the reason, for the sample: one odd row never fails the job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import jsonschema

from swarm_contracts.evals import ChoiceGrader, Contains, ExactMatch, Grader, JsonValid, Regex


def _norm(text: str, case_sensitive: bool) -> str:
    text = text.strip()
    return text if case_sensitive else text.casefold()


def exact_match(spec: ExactMatch, got: str, expected: str) -> bool:
    return _norm(got, spec.case_sensitive) == _norm(expected, spec.case_sensitive)


def contains(spec: Contains, got: str, expected: str) -> bool:
    return _norm(expected, spec.case_sensitive) in _norm(got, spec.case_sensitive)


def regex(spec: Regex, got: str, expected: str) -> bool:
    return re.search(spec.pattern, got.strip()) is not None


def json_valid(spec: JsonValid, got: str, expected: str) -> bool:
    try:
        value = json.loads(got)
    except json.JSONDecodeError:
        return False
    if spec.json_schema is None:
        return True
    validator = jsonschema.validators.validator_for(spec.json_schema)(spec.json_schema)
    return bool(validator.is_valid(value))


def choice(spec: ChoiceGrader, got: str, expected: str) -> bool:
    options = {_norm(o, spec.case_sensitive): o for o in spec.options}
    want = _norm(expected, spec.case_sensitive)
    if want not in options:
        raise ValueError(f"expected answer {expected!r} is none of the options {spec.options}")
    answer = _norm(got, spec.case_sensitive)
    # The longest option first: "yes, definitely" names "yes", not a shorter prefix of it.
    for option in sorted(options, key=len, reverse=True):
        rest = answer[len(option) :]
        if answer.startswith(option) and not (rest[:1].isalnum() or rest[:1] == "_"):
            return option == want
    return False


_GRADE: dict[type, Callable[..., bool]] = {
    ExactMatch: exact_match,
    Contains: contains,
    Regex: regex,
    JsonValid: json_valid,
    ChoiceGrader: choice,
}


@dataclass
class Graded:
    """One row's scores (metric -> 0 or 1) and, per metric, why it could not be graded."""

    scores: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def grade(graders: list[Grader], got: str, expected: str) -> Graded:
    graded = Graded()
    for spec in graders:
        try:
            ok = _GRADE[type(spec)](spec, got, expected)
        except Exception as exc:
            graded.scores[spec.metric] = 0.0
            graded.errors[spec.metric] = f"{type(exc).__name__}: {exc}"
            continue
        graded.scores[spec.metric] = 1.0 if ok else 0.0
    return graded

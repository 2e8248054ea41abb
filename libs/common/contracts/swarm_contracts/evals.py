"""Task evals (contract): what a job spec's ``evals`` asks for, and what an evaluation found.

A job with ``evals`` generates from its adapter on a held-out set at each validation and at
the end, and grades each output against the row's expected answer. Each grader gives one
metric (its ``name``, by default its type): the fraction of rows it passed. Everything a
grader needs is checked here, when the spec is parsed, so a bad spec is refused up front
rather than a job that fails later.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm_contracts.names import METRIC_PATTERN

DATASET_ID_PATTERN = r"^ds-[0-9a-f]{16,64}$"
# Generating is the expensive part of an eval: every row costs up to this many forwards.
MAX_NEW_TOKENS = 512
GRADERS = ("exact_match", "contains", "regex", "json_valid", "choice")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Grader(_Strict):
    name: str | None = Field(
        default=None,
        pattern=METRIC_PATTERN,
        description="the metric's name (default: the grader's type)",
    )

    @property
    def metric(self) -> str:
        return self.name or str(getattr(self, "type"))  # noqa: B009 (each subclass has one)


class ExactMatch(_Grader):
    """The output equals the expected answer, both stripped (and case-folded unless
    ``case_sensitive``)."""

    type: Literal["exact_match"] = "exact_match"
    case_sensitive: bool = True


class Contains(_Grader):
    """The expected answer appears in the output."""

    type: Literal["contains"] = "contains"
    case_sensitive: bool = True


class Regex(_Grader):
    """``pattern`` matches somewhere in the stripped output (``re.search``: anchor it with
    ``^...$`` for the whole output); the expected answer is not used."""

    type: Literal["regex"] = "regex"
    pattern: str = Field(min_length=1, max_length=1000)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from exc
        return v


class JsonValid(_Grader):
    """The output parses as JSON and, with ``schema``, is valid under that JSON Schema.

    That the schema compiles is checked by the gateway (``swarm_gateway.job_checks``), which
    has a JSON Schema library: the contracts stay pydantic-only."""

    type: Literal["json_valid"] = "json_valid"
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class ChoiceGrader(_Grader):
    """The output names one of ``options`` (the stripped output equals it, or begins with it
    then a non-word character) and it is the expected one."""

    type: Literal["choice"] = "choice"
    options: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=2, max_length=100
    )
    case_sensitive: bool = False


Grader = Annotated[
    ExactMatch | Contains | Regex | JsonValid | ChoiceGrader, Field(discriminator="type")
]


class EvalSpec(_Strict):
    """``evals`` of a job spec. The held-out rows come from ``dataset`` (an uploaded dataset
    of prompt/completion or chat rows), or ``fraction`` of the training set (held out of
    training), or, with neither, the job's validation set (``validation``, else the
    ``training.val_fraction`` held out)."""

    dataset: str | None = Field(default=None, pattern=DATASET_ID_PATTERN)
    fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    graders: list[Grader] = Field(min_length=1, max_length=8)
    max_new_tokens: int = Field(default=32, ge=1, le=MAX_NEW_TOKENS)
    max_examples: int = Field(
        default=200, ge=1, le=5000, description="rows graded per evaluation (the first ones)"
    )
    samples: int = Field(
        default=5, ge=0, le=50, description="(prompt, expected, got) rows kept per evaluation"
    )
    select_by: str | None = Field(
        default=None,
        pattern=METRIC_PATTERN,
        description="keep the adapter with the highest value of this grader metric "
        "(default: the lowest eval loss)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> EvalSpec:
        if self.dataset is not None and self.fraction is not None:
            raise ValueError("give evals.dataset or evals.fraction, not both")
        names = [g.metric for g in self.graders]
        if len(set(names)) != len(names):
            raise ValueError(
                f"two graders give the same metric {names}: name them apart with 'name'"
            )
        if self.select_by is not None and self.select_by not in names:
            raise ValueError(
                f"select_by {self.select_by!r} is none of the graders' metrics {names}"
            )
        return self

    @property
    def metrics(self) -> list[str]:
        return [g.metric for g in self.graders]


class EvalSample(BaseModel):
    """One graded row: what was asked, expected and generated; ``scores``: metric -> 0 or 1;
    ``errors``: metric -> why a grader could not grade it (scored 0)."""

    prompt: str
    expected: str
    got: str
    scores: dict[str, float] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict)


class EvalResult(BaseModel):
    """One evaluation's outcome: each grader's metric over ``examples`` rows, and a sample."""

    step: int
    metrics: dict[str, float]
    examples: int
    samples: list[EvalSample] = Field(default_factory=list)
    eval_s: float = 0.0

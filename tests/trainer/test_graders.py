"""Graders of task evals: each one's verdicts, a row a grader cannot grade, and the metrics."""

from __future__ import annotations

import pytest

from swarm_contracts.evals import ChoiceGrader, Contains, EvalSpec, ExactMatch, JsonValid, Regex
from swarm_trainer.graders import grade
from swarm_trainer.reports import Evaluation
from swarm_trainer.task_eval import EvalRow, eval_row, score
from swarm_trainer.train_state import TrainState


@pytest.mark.parametrize(
    ("grader", "got", "expected", "ok"),
    [
        (ExactMatch(), "  olleh\n", "olleh", True),
        (ExactMatch(), "Olleh", "olleh", False),
        (ExactMatch(case_sensitive=False), "OLLEH ", "olleh", True),
        (ExactMatch(), "olleh!", "olleh", False),
        (Contains(), "the answer is 42.", "42", True),
        (Contains(), "the answer is 4 2", "42", False),
        (Contains(case_sensitive=False), "PARIS it is", "paris", True),
        (Regex(pattern=r"^\d{3}-\d{4}$"), " 555-1234 ", "", True),
        (Regex(pattern=r"^\d{3}-\d{4}$"), "555-12345", "", False),
        (JsonValid(), '{"a": 1}', "", True),
        (JsonValid(), "{a: 1}", "", False),
        (JsonValid(schema={"type": "object", "required": ["a"]}), '{"a": 1}', "", True),
        (JsonValid(schema={"type": "object", "required": ["a"]}), '{"b": 1}', "", False),
        (ChoiceGrader(options=["yes", "no"]), "Yes.", "yes", True),
        (ChoiceGrader(options=["yes", "no"]), "no", "yes", False),
        (ChoiceGrader(options=["yes", "no"]), "yesterday", "yes", False),
        (ChoiceGrader(options=["no", "not sure"]), "not sure, really", "not sure", True),
    ],
)
def test_each_grader_scores_a_row(grader, got: str, expected: str, ok: bool) -> None:
    graded = grade([grader], got, expected)
    assert graded.scores == {grader.metric: 1.0 if ok else 0.0}
    assert graded.errors == {}


def test_a_grader_that_raises_scores_the_row_zero_and_says_why() -> None:
    graders = [ChoiceGrader(options=["yes", "no"]), ExactMatch()]
    graded = grade(graders, "maybe", "maybe")
    # The expected answer is none of the options: choice cannot grade it; exact match can.
    assert graded.scores == {"choice": 0.0, "exact_match": 1.0}
    assert "none of the options" in graded.errors["choice"]
    assert "exact_match" not in graded.errors


def test_score_averages_each_metric_and_keeps_a_sample_with_the_failure_reason() -> None:
    spec = EvalSpec(
        graders=[{"type": "exact_match"}, {"type": "choice", "options": ["a", "b"]}], samples=2
    )
    rows = [EvalRow("p1", "a"), EvalRow("p2", "b"), EvalRow("p3", "c"), EvalRow("p4", "a")]
    result = score(spec, rows, ["a", "a", "c", "a"], step=7)
    assert result.step == 7
    assert result.examples == 4
    assert result.metrics == {"exact_match": 0.75, "choice": 0.5}
    assert [(s.prompt, s.expected, s.got) for s in result.samples] == [
        ("p1", "a", "a"),
        ("p2", "b", "a"),
    ]
    failing = score(spec, rows[2:3], ["c"], step=7).samples[0]
    assert failing.scores == {"exact_match": 1.0, "choice": 0.0}
    assert "none of the options" in failing.errors["choice"]


def test_eval_rows_are_prompts_with_an_answer() -> None:
    assert eval_row({"prompt": "2+2=", "completion": "4"}) == EvalRow("2+2=", "4")
    chat = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    assert eval_row(chat) == EvalRow("user: hi\nassistant: ", "hello")
    assert eval_row({"text": "no answer here"}) is None
    assert eval_row({"messages": [{"role": "user", "content": "hi"}]}) is None


def test_best_evaluation_by_a_task_metric_instead_of_eval_loss() -> None:
    first = Evaluation(step=5, eval_loss=1.0, perplexity=2.7, task={"exact_match": 0.9})
    second = Evaluation(step=10, eval_loss=0.5, perplexity=1.6, task={"exact_match": 0.4})
    by_loss, by_metric = TrainState(), TrainState()
    assert by_loss.evaluated(first)
    assert by_loss.evaluated(second)
    assert by_loss.best == second
    assert by_metric.evaluated(first, "exact_match")
    assert not by_metric.evaluated(second, "exact_match")
    assert by_metric.best == first
    # A tie on the metric goes to the lower eval loss.
    tie = Evaluation(step=15, eval_loss=0.7, perplexity=2.0, task={"exact_match": 0.9})
    assert by_metric.evaluated(tie, "exact_match")
    assert by_metric.best == tie


def test_train_state_keeps_the_best_evals_through_a_checkpoint() -> None:
    spec = EvalSpec(graders=[{"type": "exact_match"}])
    state = TrainState(step=3)
    state.evaluated(Evaluation(step=3, eval_loss=1.0, perplexity=2.7, task={"exact_match": 1.0}))
    state.best_evals = score(spec, [EvalRow("p", "a")], ["a"], step=3)
    again = TrainState.from_json(state.to_json())
    assert again.best == state.best
    assert again.best_evals == state.best_evals
    assert again.metrics(elapsed_s=1.0).event_metrics()["exact_match"] == 1.0


def test_an_evaluation_is_kept_in_the_lineage_as_flat_figures() -> None:
    evaluation = Evaluation(step=5, eval_loss=1.0, perplexity=2.7, task={"exact_match": 0.9})
    assert evaluation.figures() == {
        "step": 5,
        "eval_loss": 1.0,
        "perplexity": 2.7,
        "exact_match": 0.9,
    }
    assert Evaluation(step=1, eval_loss=1.0, perplexity=2.7).figures() == {
        "step": 1,
        "eval_loss": 1.0,
        "perplexity": 2.7,
    }

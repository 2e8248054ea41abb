"""The demo's ending: held-out prompts with the base's and the adapter's answers, the
exact-match rate of each, and its own check of its targets (exit 1 when missed)."""

from __future__ import annotations

from rich.console import Console

from swarm.demo import ADAPTER_TARGET, adapter_evaluation, show_results
from swarm.progress import Evaluated, FollowResult
from swarm_contracts.evals import EvalResult, EvalSample
from swarm_contracts.jobs import JobRecord, JobSpec

PROMPTS = [f"p{i}" for i in range(4)]


def evaluated(step: int, rate: float, got: str, eval_loss: float = 1.0) -> Evaluated:
    samples = [
        EvalSample(prompt=p, expected="{}", got=got, scores={"exact_match": float(got == "{}")})
        for p in PROMPTS
    ]
    result = EvalResult(step=step, metrics={"exact_match": rate}, examples=40, samples=samples)
    return Evaluated(eval_loss=eval_loss, evals=result)


def result(*evaluations: Evaluated) -> FollowResult:
    spec = JobSpec(name="demo-adapter", base_model="tiny-llama", dataset="ds-" + "0" * 24)
    record = JobRecord(job_id="job-0123456789", tenant="default", spec=spec)
    return FollowResult(record=record, eval_loss=1.0, evaluations=list(evaluations))


def shown(follow: FollowResult) -> tuple[int, str]:
    console = Console(record=True, width=200)
    code = show_results(follow, console)
    return code, console.export_text()


def test_the_table_shows_both_answers_and_rates_and_passes_when_the_adapter_learned() -> None:
    code, text = shown(result(evaluated(0, 0.0, "cat is"), evaluated(10, 0.95, "{}")))
    assert code == 0, text
    assert "the adapter learned the task" in text
    row = next(line for line in text.splitlines() if "p0" in line)
    assert "cat is" in row
    assert row.count("{}") == 2  # expected and the adapter's answer
    rates = next(line for line in text.splitlines() if "exact_match rate" in line)
    assert "0.0%" in rates
    assert "95.0%" in rates


def test_the_demo_fails_when_the_adapter_misses_its_target_or_the_base_already_knows() -> None:
    low = ADAPTER_TARGET - 0.05
    code, text = shown(result(evaluated(0, 0.0, "x"), evaluated(10, low, "x")))
    assert code == 1
    assert "targets missed" in text
    code, text = shown(result(evaluated(0, 0.5, "{}"), evaluated(10, 1.0, "{}")))
    assert code == 1
    code, text = shown(result(evaluated(10, 1.0, "{}")))  # no baseline: nothing to compare
    assert code == 1


def test_the_adapter_shown_is_the_one_kept_by_exact_match() -> None:
    best = evaluated(10, 0.9, "{}", eval_loss=2.0)
    later = evaluated(20, 0.8, "{}", eval_loss=1.0)
    assert adapter_evaluation([evaluated(0, 0.0, "x"), best, later]) is best

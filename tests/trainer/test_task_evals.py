"""A real Ray Train run with task evals: they run at each validation, their metrics and
sample reach the reports and the run's metrics, and ``select_by`` picks the adapter kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_runtime.store import LocalStore
from swarm_trainer import reports
from swarm_trainer.run import run_job
from swarm_trainer.settings import TrainerSettings

from .conftest import drain, make_assignment, put_dataset

pytestmark = pytest.mark.slow


def test_a_run_with_evals_grades_each_validation_and_keeps_the_best_by_its_metric(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from swarm_contracts.evals import EvalResult, EvalSpec
    from swarm_trainer.control import make_control

    store = LocalStore(tmp_path / "store")
    settings = TrainerSettings(store_url=store.url, work_dir=tmp_path / "work")
    job = make_assignment(store, tiny_model_dir, training={"max_steps": 4, "eval_every": 2})
    eval_set = put_dataset(
        store,
        [
            {"prompt": f"Question: what is {i} plus {i}? Answer:", "completion": ""}
            for i in range(3)
        ],
    )
    evals = EvalSpec(
        dataset=eval_set.id,
        # ``regex`` "." passes any output that is not blank, exact match against "" any that is.
        graders=[{"type": "exact_match"}, {"type": "regex", "pattern": "."}],
        max_new_tokens=4,
        samples=2,
        select_by="regex",
    )
    job = job.model_copy(
        update={"spec": job.spec.model_copy(update={"evals": evals}), "eval_dataset": eval_set}
    )
    control = make_control()
    result = run_job(job, settings, store, control=control)
    assert result is not None

    validated = [m for m in drain(control) if isinstance(m, reports.Validated)]
    # Step 0: the baseline (a fresh adapter is the base model), then each validation.
    assert [m.step for m in validated] == [0, 2, 4]
    found = [EvalResult.model_validate_json(m.evals or "") for m in validated]
    for step, evaluation in zip((0, 2, 4), found, strict=True):
        assert evaluation.step == step
        assert evaluation.examples == 3
        assert set(evaluation.metrics) == {"exact_match", "regex"}
        assert len(evaluation.samples) == 2
        assert evaluation.samples[0].prompt == "Question: what is 0 plus 0? Answer:"
        assert evaluation.samples[0].expected == ""
    # The best by regex (ties: lower eval loss) is what the run reports.
    best = max(found, key=lambda e: (e.metrics["regex"], -validated[found.index(e)].eval_loss))
    metrics = result.metrics
    assert metrics.best_step == best.step
    assert metrics.evals is not None
    assert metrics.evals.metrics == best.metrics
    assert metrics.event_metrics()["regex"] == best.metrics["regex"]

"""The sweep's trials table and its scatter plots, from a sweep record (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from swarm.errors import SwarmError
from swarm.plot import sweep_points, write_sweep_png
from swarm.sweep_view import summary, trials_table
from swarm_contracts.jobs import AdapterRef
from swarm_contracts.sweeps import BestTrial, SweepDetail, SweepSpec, TrialRecord, TrialState

SPEC = SweepSpec.model_validate(
    {
        "name": "lr-search",
        "base": {"base_model": "tiny", "dataset": "ds-" + "ab" * 12},
        "search": {
            "training.lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1},
            "lora.target_modules": {
                "type": "choice",
                "values": [["q_proj", "v_proj"], "all-linear"],
            },
        },
        "budget": 4,
    }
)


def trial(n: int, lr: float, state: TrialState, **fields: object) -> TrialRecord:
    target = ["q_proj", "v_proj"] if n % 2 else "all-linear"
    return TrialRecord(
        sweep_id="sweep-0123456789",
        trial=n,
        job_id=f"job-{n:08d}",
        params={"training.lr": lr, "lora.target_modules": target},
        state=state,
        **fields,  # type: ignore[arg-type]
    )


def sweep() -> SweepDetail:
    adapter = AdapterRef(name="lr-search", version=2, store_key="adapters/default/lr-search/2")
    trials = [
        trial(0, 1e-3, TrialState.succeeded, value=1.5, evals={2: 2.0, 4: 1.5}),
        trial(1, 3e-4, TrialState.succeeded, value=1.2, evals={2: 1.9, 4: 1.2}, adapter=adapter),
        trial(2, 5e-2, TrialState.pruned, evals={2: 7.5}, pruned_at_step=2),
        trial(3, 1e-4, TrialState.running),
    ]
    best = BestTrial(trial=1, value=1.2, params=trials[1].params, job_id="j", adapter=adapter)
    return SweepDetail(
        sweep_id="sweep-0123456789", tenant="default", spec=SPEC, trials=trials, best=best
    )


def render(renderable: object) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_table_has_a_row_per_trial_with_its_parameters_and_metric() -> None:
    text = render(trials_table(sweep()))
    assert "lr-search" in text
    assert "3/4 trials" in text
    assert "training.lr" in text
    assert "lora.target_modules" in text
    rows = {line.split()[1]: line for line in text.splitlines() if "job-0" in line}
    assert sorted(rows) == ["0", "1", "2", "3"]
    assert "★" in rows["1"]
    assert "1.2" in rows["1"]
    assert "q_proj,v_proj" in rows["1"]
    assert "★" not in rows["0"]
    assert "all-linear" in rows["0"]
    assert "pruned @2" in rows["2"]
    assert "7.5 @2" in rows["2"]
    assert "running" in rows["3"]
    line = render(summary(sweep()))
    assert "best: trial 1, eval_loss 1.2" in line
    assert "lr-search v2" in line


def test_the_plot_has_every_evaluated_trial(tmp_path: Path) -> None:
    points = sweep_points(sweep())
    # Finished trials with their value; the pruned one with its last evaluation, marked.
    assert [(t.trial, v, final) for t, v, final in points] == [
        (0, 1.5, True),
        (1, 1.2, True),
        (2, 7.5, False),
    ]
    out = tmp_path / "sweep.png"
    write_sweep_png(sweep(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    empty = sweep().model_copy(update={"trials": [trial(0, 1e-3, TrialState.queued)]})
    with pytest.raises(SwarmError, match="no evaluated trial"):
        write_sweep_png(empty, out)

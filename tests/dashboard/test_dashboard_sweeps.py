"""The dashboard's sweep view in headless Chromium: the trials table and a scatter plot of the
metric against each parameter, from a sweep and its trials as the sweeps service records them
(written straight into KV here: the page only reads them through the gateway)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nats
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from swarm_contracts.jobs import AdapterRef
from swarm_contracts.subjects import Subjects
from swarm_contracts.sweeps import (
    BestTrial,
    SweepRecord,
    SweepSpec,
    SweepState,
    TrialRecord,
    TrialState,
    trial_key,
)
from swarm_gateway.app import create_app
from swarm_runtime.records import RecordTable
from swarm_runtime.settings import Settings
from swarm_runtime.topology import ensure_topology, kv_bucket

from ..conftest import ServerThread
from .test_dashboard_browser import click_until, until

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "sweep.png"
SWEEP_ID = "sweep-00112233445566778899"
TARGETS = [["q_proj", "v_proj"], "all-linear"]

# The sweep view as the page shows it at one moment (the page's JS cannot redraw in between).
SNAPSHOT = """
const attr = (el, name) => el.getAttribute(name);
return {
  summary: document.getElementById("sweep-summary").innerText,
  rows: [...document.querySelectorAll("#trials tbody tr")].map((r) => ({
    trial: attr(r, "data-trial"), state: attr(r, "data-state"), text: r.innerText,
  })),
  charts: [...document.querySelectorAll("#sweep-charts svg.scatter")].map((c) => ({
    param: attr(c, "data-param"),
    points: attr(c, "data-points"),
    best: c.querySelectorAll("circle.pt.best").length,
    partial: c.querySelectorAll("circle.pt.partial").length,
    text: c.textContent,
  })),
};
"""


async def seed(settings: Settings) -> None:
    spec = SweepSpec.model_validate(
        {
            "name": "lr-search",
            "base": {"base_model": "tiny-llama", "dataset": "ds-" + "ab" * 12},
            "search": {
                "training.lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1},
                "lora.target_modules": {"type": "choice", "values": TARGETS},
            },
            "budget": 6,
            "early_stopping": {"type": "asha", "min_step": 2, "reduction_factor": 2},
        }
    )
    # (lr, state, evaluations, final metric) of trials 0-5.
    outcomes = [
        (3e-3, TrialState.succeeded, {2: 2.4, 4: 1.9}, 1.9),
        (1e-2, TrialState.succeeded, {2: 2.2, 4: 1.7}, 1.7),
        (8e-2, TrialState.pruned, {2: 4.5}, None),
        (2e-4, TrialState.succeeded, {2: 3.1, 4: 2.6}, 2.6),
        (5e-3, TrialState.succeeded, {2: 2.3, 4: 1.8}, 1.8),
        (4e-4, TrialState.running, {2: 2.2}, None),
    ]
    trials = [
        TrialRecord(
            sweep_id=SWEEP_ID,
            trial=n,
            job_id=f"job-{n:020d}",
            params={"training.lr": lr, "lora.target_modules": TARGETS[n % 2]},
            state=state,
            evals=evals,
            value=value,
            pruned_at_step=2 if state == TrialState.pruned else None,
        )
        for n, (lr, state, evals, value) in enumerate(outcomes)
    ]
    adapter = AdapterRef(name="lr-search", version=2, store_key="adapters/default/lr-search/2")
    sweep = SweepRecord(
        sweep_id=SWEEP_ID,
        tenant="default",
        spec=spec,
        state=SweepState.running,
        best=BestTrial(trial=1, value=1.7, params=trials[1].params, job_id="j", adapter=adapter),
    )
    nc = await nats.connect(settings.nats_url)
    try:
        js, subjects = nc.jetstream(), Subjects(settings.namespace)
        await ensure_topology(js, subjects)
        await RecordTable(await kv_bucket(js, subjects, "sweeps"), SweepRecord).put(SWEEP_ID, sweep)
        table = RecordTable(await kv_bucket(js, subjects, "trials"), TrialRecord)
        for trial in trials:
            await table.put(trial_key(SWEEP_ID, trial.trial), trial)
    finally:
        await nc.close()


@pytest.mark.slow
async def test_the_sweep_view_shows_the_trials_and_the_metric_against_each_parameter(
    settings: Settings, browser: Chrome, tmp_path: Path
) -> None:
    await seed(settings)
    with ServerThread(create_app(settings)) as server:
        browser.get(server.url + "/")
        row_css = f'#sweeps tr[data-sweep-id="{SWEEP_ID}"]'
        click_until(browser, row_css, lambda d: d.find_element(By.ID, "sweep-view").is_displayed())
        until(browser, lambda d: SWEEP_ID in d.find_element(By.ID, "sweep-title").text)

        # The view is redrawn every poll: read it whole in one JS turn, once it has all six rows.
        def whole_view(d: Chrome) -> dict | None:
            view = d.execute_script(SNAPSHOT)
            return view if len(view["rows"]) == 6 and len(view["charts"]) == 2 else None

        view = until(browser, whole_view)
        assert isinstance(view, dict)
        assert "trial 1: 1.7 (lr-search v2)" in view["summary"]
        assert "asha" in view["summary"]

        # One row per trial: parameters, state (pruned at its rung), last evaluation, best.
        rows = view["rows"]
        assert [r["trial"] for r in rows] == [str(n) for n in range(6)]
        assert "★" in rows[1]["text"]
        assert "all-linear" in rows[1]["text"]
        assert "q_proj,v_proj" in rows[0]["text"]
        assert rows[2]["state"] == "pruned"
        assert "@2" in rows[2]["text"]
        assert "2.2 @2" in rows[5]["text"]  # running: its last evaluation so far

        # A scatter per parameter; every evaluated trial is a point (the running and pruned
        # ones at their last evaluation), the best one marked.
        charts = view["charts"]
        assert [c["param"] for c in charts] == ["training.lr", "lora.target_modules"]
        for chart in charts:
            assert chart["points"] == "6"
            assert chart["best"] == 1
            assert chart["partial"] == 2
        assert "all-linear" in charts[1]["text"]  # choices are labelled categories

        # The page remembers the selection in its address, for a reload or a shared link.
        assert browser.current_url.endswith(f"#sweep={SWEEP_ID}")
        shot = tmp_path / "sweep.png"
        browser.set_window_size(1600, 2600)  # the whole panel in view, for its picture
        panel = browser.find_element(By.ID, "sweeps-panel")
        browser.execute_script("arguments[0].scrollIntoView();", panel)
        panel.screenshot(str(shot))
        assert shot.stat().st_size > 5_000
        if os.environ.get("SWARM_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(shot, DOCS_SCREENSHOT)

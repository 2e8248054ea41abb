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
from .test_dashboard_browser import until

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "sweep.png"
SWEEP_ID = "sweep-00112233445566778899"
TARGETS = [["q_proj", "v_proj"], "all-linear"]


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
        until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row_css))
        browser.find_element(By.CSS_SELECTOR, row_css).click()
        until(browser, lambda d: d.find_element(By.ID, "sweep-view").is_displayed())
        assert SWEEP_ID in browser.find_element(By.ID, "sweep-title").text
        summary = browser.find_element(By.ID, "sweep-summary").text
        assert "trial 1: 1.7 (lr-search v2)" in summary
        assert "asha" in summary

        # One row per trial: parameters, state (pruned at its rung), last evaluation, best.
        rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
        assert [r.get_attribute("data-trial") for r in rows] == [str(n) for n in range(6)]
        assert "★" in rows[1].text
        assert "all-linear" in rows[1].text
        assert "q_proj,v_proj" in rows[0].text
        assert rows[2].get_attribute("data-state") == "pruned"
        assert "@2" in rows[2].text
        assert "2.2 @2" in rows[5].text  # running: its last evaluation so far

        # A scatter per parameter; every evaluated trial is a point (the running and pruned
        # ones at their last evaluation), the best one marked.
        charts = browser.find_elements(By.CSS_SELECTOR, "#sweep-charts svg.scatter")
        assert [c.get_attribute("data-param") for c in charts] == [
            "training.lr",
            "lora.target_modules",
        ]
        for chart in charts:
            assert chart.get_attribute("data-points") == "6"
            assert len(chart.find_elements(By.CSS_SELECTOR, "circle.pt.best")) == 1
            assert len(chart.find_elements(By.CSS_SELECTOR, "circle.pt.partial")) == 2
        assert "all-linear" in charts[1].text  # choices are labelled categories

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

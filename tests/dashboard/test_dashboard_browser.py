"""The dashboard in headless Chromium against real services: live curves (loss and task
metrics), and the API key."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from swarm_contracts.jobs import JobState
from swarm_gateway.app import create_app
from swarm_gateway.settings import GatewaySettings
from swarm_runtime.settings import Settings

from ..conftest import ServerThread
from .conftest import Stack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"
MAX_STEPS = 40


def job_spec(stack: Stack) -> dict:
    # Long enough (40 steps) that the page sees the curve grow between two polls.
    return {
        "name": "dashboard-demo",
        "base_model": "tiny-llama",
        "dataset": stack.train.id,
        "validation": stack.validation.id,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "max_steps": MAX_STEPS,
            "batch_size": 8,
            "lr": 3e-3,
            "warmup_steps": 2,
            "seq_len": 64,
            # Frequent evals and checkpoints stretch the run over several of the page's 1 s
            # polls even on a fast machine (and put eval points on the chart).
            "eval_every": 5,
            "checkpoint_every": 10,
        },
        # Graded at every evaluation: the metric chart beside the loss, and the sample table.
        "evals": {
            "graders": [{"type": "exact_match"}, {"type": "json_valid"}],
            "max_new_tokens": 8,
            "samples": 2,
        },
    }


def until(driver: Chrome, what: Callable[[Chrome], object], timeout: float = 60) -> object:
    """Poll ``what`` until truthy; the page re-renders every second, so stale elements retry."""
    return WebDriverWait(
        driver, timeout, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    ).until(what)


def click_until(driver: Chrome, css: str, then: Callable[[Chrome], object]) -> None:
    """Click the element at ``css`` until ``then`` holds. The page redraws its tables every
    poll, so a row found may be replaced before the click lands (stale) or the click may go
    to the old row; selecting is idempotent, so clicking again is safe."""

    def attempt(d: Chrome) -> object:
        d.find_element(By.CSS_SELECTOR, css).click()
        return then(d)

    until(driver, attempt)


def chart_points(driver: Chrome, series: str) -> int:
    """The loss chart's ``data-<series>-points``, read in one JS turn (a redraw replaces the
    chart, so a found element may be stale by the time it is read)."""
    return int(
        driver.execute_script(
            "const c = document.getElementById('loss-chart');"
            "return (c && c.getAttribute(arguments[0])) || 0;",
            f"data-{series}-points",
        )
    )


def metric_chart(driver: Chrome) -> tuple[str, int]:
    """The task-metric chart's (metric names, points), read in one JS turn."""
    names, points = driver.execute_script(
        "const c = document.getElementById('metric-chart');"
        "return [c.getAttribute('data-metrics'), c.getAttribute('data-metric-points')];"
    )
    return names, int(points)


def train_points(driver: Chrome) -> int:
    return chart_points(driver, "train")


def polyline_points(driver: Chrome, css_class: str) -> int:
    # Read in the page's own JS turn: a redraw cannot replace the line between find and read.
    return int(
        driver.execute_script(
            "const l = document.querySelector(arguments[0]);"
            "return l ? l.getAttribute('points').trim().split(/\\s+/).length : 0;",
            f"#loss-chart polyline.{css_class}",
        )
    )


def test_the_dashboard_draws_a_running_jobs_loss_curve_as_it_grows(
    stack: Stack, browser: Chrome, tmp_path: Path
) -> None:
    job = stack.client.submit(job_spec(stack), idempotency_key=f"dashboard-{time.time_ns()}")
    browser.get(stack.local.gateway_url + "/")
    assert browser.title == "Swarm dashboard"

    # The worker and its load, from /v1/workers.
    worker_css = '#workers tr[data-worker-id="dashboard-worker"]'
    until(browser, lambda d: "alive" in d.find_element(By.CSS_SELECTOR, worker_css).text)

    # Select the job in the jobs table.
    row_css = f'#jobs tr[data-job-id="{job.job_id}"]'

    def selected(d: Chrome) -> bool:
        return "selected" in (d.find_element(By.CSS_SELECTOR, row_css).get_attribute("class") or "")

    click_until(browser, row_css, selected)
    # The title follows once the page has fetched the job.
    until(browser, lambda d: job.job_id in d.find_element(By.ID, "job-title").text)
    assert job.job_id in browser.find_element(By.ID, "job-title").text

    # The curve grows while the job runs: the page showed a part of it, then all of it. (Read
    # every 0.2 s; the page redraws about once a second.)
    until(browser, train_points, timeout=90)
    readings = [train_points(browser)]
    deadline = time.monotonic() + 120
    while readings[-1] < MAX_STEPS and time.monotonic() < deadline:
        time.sleep(0.2)
        readings.append(train_points(browser))
    assert readings == sorted(readings), readings
    assert any(0 < n < MAX_STEPS for n in readings), f"never a partial curve: {readings}"
    assert readings[-1] == MAX_STEPS, readings

    # Events stream in over SSE (fetch-based, so it would also carry a key).
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#events li[data-event="progress"]'))

    done = stack.client.wait(job.job_id, timeout=240)
    assert done.state == JobState.succeeded, done.reason
    # The final picture: every step, the eval points, the end event and the adapter.
    until(browser, lambda d: train_points(d) == MAX_STEPS)
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#events li[data-event="succeeded"]'))
    until(browser, lambda d: "dashboard-demo v" in d.find_element(By.ID, "job-summary").text)
    evals = chart_points(browser, "eval")
    assert evals >= 1
    assert polyline_points(browser, "eval") == evals
    assert polyline_points(browser, "train") == MAX_STEPS
    # Each evaluation graded the held-out prompts: one point per metric per evaluation, drawn
    # beside the loss, the metrics in the summary and the latest sample under the chart.
    assert metric_chart(browser) == ("exact_match,json_valid", evals)
    assert browser.find_element(By.ID, "metric-chart").is_displayed()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#metric-chart polyline.metric")) == 2
    assert "exact_match: " in browser.find_element(By.ID, "job-summary").text
    until(browser, lambda d: "exact_match " in d.find_element(By.CSS_SELECTOR, row_css).text)
    samples = browser.find_element(By.ID, "eval-samples")
    assert f"at step {MAX_STEPS}" in samples.find_element(By.TAG_NAME, "caption").text
    assert len(samples.find_elements(By.CSS_SELECTOR, "tr")) == 1 + 2  # header and the sample
    until(
        browser,
        lambda d: (
            d.find_element(By.CSS_SELECTOR, row_css).get_attribute("data-state") == "succeeded"
        ),
    )

    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    # The PNG in docs/ is documentation: refresh it only when asked to.
    if os.environ.get("SWARM_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_SCREENSHOT)


def test_the_playground_streams_a_models_answer(stack: Stack, browser: Chrome) -> None:
    deadline = time.monotonic() + 90
    while not any(e["id"] == "tiny-llama" and e["served"] for e in stack.client.served_models()):
        assert time.monotonic() < deadline, "no inference worker holds tiny-llama"
        time.sleep(0.5)
    expected = stack.client.chat("tiny-llama", "hello there", max_tokens=12, temperature=0)

    browser.get(stack.local.gateway_url + "/")
    row_css = '#models tr[data-model-id="tiny-llama"]'

    def pick(d: Chrome) -> bool:
        row = d.find_element(By.CSS_SELECTOR, row_css)
        if "served" not in row.text:
            return False
        row.click()
        return d.find_element(By.ID, "playground-model").text == "tiny-llama"

    until(browser, pick)
    browser.find_element(By.ID, "playground-prompt").send_keys("hello there")
    tokens = browser.find_element(By.ID, "playground-max-tokens")
    tokens.clear()
    tokens.send_keys("12")
    browser.find_element(By.ID, "playground-send").click()
    output = browser.find_element(By.ID, "playground-output")
    until(browser, lambda _: output.get_attribute("data-state") in ("done", "error"))
    assert output.get_attribute("data-state") == "done", output.get_attribute("textContent")
    assert output.get_attribute("textContent") == expected.text
    usage = browser.find_element(By.ID, "playground-usage").text
    assert "tiny-llama@1" in usage
    assert f"{expected.usage.completion_tokens} completion" in usage  # type: ignore[union-attr]


def test_with_auth_on_the_page_asks_for_a_key_and_keeps_it(
    settings: Settings, browser: Chrome
) -> None:
    keyed = GatewaySettings.of(settings, api_keys="dash-secret-key=acme")
    app = create_app(keyed)
    with ServerThread(app) as server:
        browser.get(server.url + "/dashboard")
        # No key yet: every call is a 401, and the page says what to do.
        banner = browser.find_element(By.ID, "auth-banner")
        until(browser, lambda _: banner.is_displayed())
        assert "needs an API key" in banner.text
        status = browser.find_element(By.ID, "status")
        assert status.get_attribute("data-state") == "error"

        browser.find_element(By.ID, "api-key").send_keys("dash-secret-key")
        browser.find_element(By.ID, "key-save").click()
        until(browser, lambda _: status.get_attribute("data-state") == "ok")
        assert not banner.is_displayed()
        # A tenant key lists its jobs but not the worker table, and the page says why.
        note = browser.find_element(By.ID, "workers-note")
        until(browser, lambda _: note.is_displayed())
        assert "admin" in note.text
        # The training sessions panel draws the tenant's calls per op, once one settles (what
        # Calls.on_timed records; tests/dashboard/test_dashboard_tinker.py drives real ones).
        app.state.metrics.tinker_settled("optim_step", "done", "acme", 0.3, 0.04)
        call_row = '#tinker-calls tr[data-op="optim_step"][data-done="1"]'
        until(browser, lambda d: "≤ 0.05" in d.find_element(By.CSS_SELECTOR, call_row).text)

        # Kept in this browser: a reload is authorised without typing the key again.
        stored = browser.execute_script("return localStorage.getItem('swarm.apiKey')")
        assert stored == "dash-secret-key"
        browser.refresh()
        status = browser.find_element(By.ID, "status")
        until(browser, lambda _: status.get_attribute("data-state") == "ok")

        # A wrong key is refused again, and the banner says it was this key.
        key_input = browser.find_element(By.ID, "api-key")
        key_input.clear()
        key_input.send_keys("not-the-key")
        browser.find_element(By.ID, "key-save").click()
        banner = browser.find_element(By.ID, "auth-banner")
        until(browser, lambda _: banner.is_displayed() and "refused" in banner.text)


def test_the_jobs_list_pages_by_fifties_and_the_selected_job_stays_in_view(
    stack: Stack, browser: Chrome
) -> None:
    # Jobs no worker can take (a label nobody has): cheap, and they wait with a reason.
    spec = job_spec(stack) | {"name": "dashboard-pager", "resources": {"labels": {"pool": "x"}}}
    waiting = [
        stack.client.submit(spec, idempotency_key=f"pager-{i}-{time.time_ns()}").job_id
        for i in range(52)
    ]
    try:
        first_page, cursor = stack.client.list_jobs(limit=50)
        second_page, _ = stack.client.list_jobs(limit=50, cursor=cursor)
        browser.get(stack.local.gateway_url + "/")
        rows = "#jobs tr.job"
        until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50)
        newer = browser.find_element(By.ID, "jobs-newer")
        older = browser.find_element(By.ID, "jobs-older")
        assert not newer.is_enabled()
        until(browser, lambda _: older.is_enabled())

        older.click()
        until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == len(second_page))
        assert browser.find_element(By.ID, "jobs-page").text == "page 2"
        shown = browser.find_element(By.ID, "jobs").get_attribute("textContent") or ""
        assert all(job.job_id in shown for job in second_page)
        newer.click()
        until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50)
        shown = browser.find_element(By.ID, "jobs").get_attribute("textContent") or ""
        assert all(job.job_id in shown for job in first_page)

        # However long the list, the selected job's panel starts within the first screen.
        click_until(
            browser,
            f'#jobs tr[data-job-id="{waiting[-1]}"]',
            lambda d: waiting[-1] in d.find_element(By.ID, "job-title").text,
        )
        top = browser.execute_script(
            "return document.getElementById('job-panel').getBoundingClientRect().top"
        )
        assert top < browser.execute_script("return window.innerHeight"), top
    finally:
        for job_id in waiting:
            stack.client.cancel(job_id)

"""Headless Chromium (through Selenium and the system chromedriver) and a real local stack.

The browser is the Debian ``chromium`` + ``chromium-driver`` packages (``make setup`` installs
them); nothing is downloaded here. Tests skip, saying why, only when those are not installed.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from swarm.client import Client
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack, StackAddresses
from swarm_contracts.datasets import DatasetInfo
from swarm_trainer.tiny_model import create_tiny_model

from ..conftest import NatsServer, free_port

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # the sandbox cannot start as root (CI containers)
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
)


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None
    )
    if not chromium or not driver:
        pytest.skip(
            "chromium and chromedriver are not installed "
            "(Debian/Ubuntu: apt-get install chromium chromium-driver; `make setup` does it)"
        )
    return chromium, driver


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is not None and report.failed


@pytest.fixture
def browser(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A fresh browser per test: a new profile dir, so no localStorage leaks between tests."""
    chromium, driver_path = _binaries()
    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    # Keep the console log, so a failing test can show the page's JS errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
        if _failed(request):
            # The page's JS errors and failed requests, before the browser goes away.
            for entry in driver.get_log("browser"):
                print("browser:", entry.get("level"), entry.get("message"))
    finally:
        driver.quit()


@dataclass
class Stack:
    local: LocalStack
    client: Client
    train: DatasetInfo
    validation: DatasetInfo


# Module scope, not session: the stack (with its Ray cluster) is gone before tests/e2e starts
# its own, so two never compete for the CI machine's cores.
@pytest.fixture(scope="module")
def stack(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _binaries()  # no browser, no point starting six services
    root = tmp_path_factory.mktemp("dashboard-stack")
    settings = StackAddresses(
        nats_url=nats_server.url, gateway_port=free_port(), telemetry_port=free_port()
    )
    local = LocalStack(
        root,
        settings=settings,
        console=Console(stderr=True, quiet=True),
        reuse_nats=True,  # the session's nats-server
        extra_env={
            "SWARM_NAMESPACE": "dash" + uuid.uuid4().hex[:8],
            "SWARM_TRAINER_CPUS": "2",
            "SWARM_WORKER_ID": "dashboard-worker",
            # 0.4 s more per step: the live-curve test sees the run in the middle, however
            # fast the machine trains the tiny model.
            "SWARM_TRAINER_TEST_HOOK": "slow_steps",
            # The inference worker (for the playground): quick to hold the new base model.
            "SWARM_INFERENCE_CPU_THREADS": "1",
            "SWARM_INFERENCE_REFRESH_S": "1",
        },
    )
    # Other stacks (tests/e2e, `swarm up`) may run beside this one.
    local.metrics_ports = {svc: free_port() for svc in local.metrics_ports}
    with local:
        client = Client(base_url=local.gateway_url)
        client.add_model("tiny-llama", create_tiny_model(root / "tiny-llama"))
        train_path, val_path = write_demo_datasets(root / "data", n_train=96, n_val=16)
        try:
            yield Stack(
                local=local,
                client=client,
                train=client.upload_dataset(train_path),
                validation=client.upload_dataset(val_path),
            )
        finally:
            client.close()


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failing test against the stack shows the services' last words."""
    yield
    if _failed(request) and "stack" in request.fixturenames:
        stack: Stack = request.getfixturevalue("stack")
        for log in sorted(stack.local.logs_dir.glob("*.log")):
            print(f"--- {log.name} (last 30 lines)")
            print("\n".join(log.read_text(errors="replace").splitlines()[-30:]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report

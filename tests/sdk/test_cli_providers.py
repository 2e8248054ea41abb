"""`swarm providers add|list|remove` on a copy of the shipped nats-server config."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from swarm.cli import app
from swarm_contracts.providers import read_credentials

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-auth.conf"


def test_add_list_remove_and_reload(tmp_path: Path) -> None:
    conf = tmp_path / "nats-auth.conf"
    conf.write_text(CONFIG.read_text())
    creds = tmp_path / "creds"
    # Stands in for nats-server: a process that SIGHUP ends, so the test sees it was sent
    # (SIGHUP's default restored: a suite run under nohup would have it ignored, and inherited).
    server = subprocess.Popen(
        ["sleep", "60"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)
    )
    pid_file = tmp_path / "nats.pid"
    pid_file.write_text(f"{server.pid}\n")
    runner = CliRunner()
    common = ["--conf", str(conf), "--creds-dir", str(creds)]
    try:
        added = runner.invoke(
            app,
            [
                "providers",
                "add",
                "acme",
                *common,
                "--pid-file",
                str(pid_file),
                "--nats-url",
                "nats://swarm.example:4222",
            ],
        )
        assert added.exit_code == 0, added.output
        assert server.wait(5) == -signal.SIGHUP
    finally:
        server.kill()
        server.wait()
    joined = read_credentials(creds / "acme.creds.json")
    assert (joined.provider, joined.nats_url) == ("acme", "nats://swarm.example:4222")
    assert f'nkey: "{joined.public_key}"' in conf.read_text()
    assert joined.nkey_seed not in conf.read_text()  # the secret stays with the provider

    again = runner.invoke(app, ["providers", "add", "acme", *common])
    assert again.exit_code == 2
    assert "exists" in again.output
    bad = runner.invoke(app, ["providers", "add", "Acme.1", *common])
    assert bad.exit_code == 2

    listed = runner.invoke(app, ["providers", "list", "--conf", str(conf), "--json"])
    assert [p["name"] for p in json.loads(listed.output)] == ["acme"]

    removed = runner.invoke(app, ["providers", "remove", "acme", *common])
    assert removed.exit_code == 0, removed.output
    assert "nats-server --signal reload" in removed.output  # no pid file: what to run
    assert not (creds / "acme.creds.json").exists()
    assert conf.read_text() == CONFIG.read_text()  # the rest of the file is untouched

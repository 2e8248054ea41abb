"""The CLI's connection settings: options, then environment, then ~/.config/swarm/config.toml."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.config import resolve

from ..conftest import ServerThread

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "SWARM_GATEWAY_URL", "SWARM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def write_config(home: Path, text: str) -> None:
    path = home / ".config" / "swarm" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_file_then_env_then_argument(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve().gateway_url == "http://127.0.0.1:8080"
    assert resolve().api_key is None
    write_config(home, 'gateway_url = "http://file:1/"\napi_key = "file-key"\n')
    assert resolve() == resolve(None, None)
    assert (resolve().gateway_url, resolve().api_key) == ("http://file:1", "file-key")
    monkeypatch.setenv("SWARM_GATEWAY_URL", "http://env:2")
    monkeypatch.setenv("SWARM_API_KEY", "env-key")
    assert (resolve().gateway_url, resolve().api_key) == ("http://env:2", "env-key")
    assert resolve("http://arg:3", "arg-key").api_key == "arg-key"


def test_cli_reads_the_config_file(home: Path, gateway: ServerThread) -> None:
    write_config(home, f'gateway_url = "{gateway.url}"\n')
    result = runner.invoke(app, ["jobs", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "[]", result.output

    # The environment wins over the file: here it points nowhere.
    result = runner.invoke(app, ["jobs"], env={"SWARM_GATEWAY_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 2
    assert "127.0.0.1:9" in result.output


def test_a_broken_config_file_is_named(home: Path) -> None:
    write_config(home, "gateway_url = \n")
    result = runner.invoke(app, ["jobs"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "config.toml" in result.output

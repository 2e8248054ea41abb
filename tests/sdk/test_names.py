"""The CLI refuses a bad name itself, by the same rule as the gateway, before any request:
a name never becomes part of a URL path or a local directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm.cli import app

runner = CliRunner()
# Nothing listens there: an answer that names the field came from the CLI's own check.
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["adapters", "pull", "../../etc"], "adapter name"),
        (["adapters", "show", "a\x1bb@2"], "adapter name"),
        (["adapters", "export", "x" * 64], "adapter name"),
        (["adapters", "alias", "bot", "../prod", "1"], "alias"),
        (["adapters", "alias", "a/b", "prod"], "adapter name"),
        (["models", "add", "../m", "{dir}"], "model name"),
        (["datasets", "upload", "{file}", "--name", "a\nb"], "name"),
        (["datasets", "upload", "{file}", "--name", "../x.jsonl"], "name"),
    ],
)
def test_bad_names_are_refused_before_any_request(
    tmp_path: Path, args: list[str], field: str
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    args = [a.format(dir=tmp_path, file=data) for a in args]
    result = runner.invoke(app, ["--url", NOWHERE, *args])
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert "cannot reach" not in result.output
    assert not (Path.cwd() / "etc-v1").exists()

"""The store layout: keys the trainer writes are the keys the registry's collector parses."""

from __future__ import annotations

import pytest

from swarm_contracts import layout
from swarm_contracts.layout import InvalidKey, join_key, validate_key


def test_keys_of_one_job() -> None:
    assert layout.run_key("job-1", 2) == "checkpoints/job-1/attempt-2"
    assert layout.resume_key("job-1", 2) == "checkpoints/job-1/attempt-2-resume"
    assert layout.output_adapter("job-1", 2) == "outputs/job-1/2/adapter"
    assert layout.output_result("job-1", 2) == "outputs/job-1/2/result.json"
    assert layout.run_key("job-1", 2).startswith(layout.job_checkpoints("job-1") + "/")


def test_artifact_keys() -> None:
    assert layout.dataset_key("acme", "ab" * 32) == f"datasets/acme/{'ab' * 32}.jsonl.zst"
    assert layout.model_prefix("tiny", "0123456789abcdef" * 4) == "models/tiny/0123456789abcdef"
    assert layout.adapter_prefix("acme", "bot", 3) == "adapters/acme/bot/3"
    assert layout.export_prefix("acme", "bot", 3) == "exports/acme/bot/3"


def test_the_collector_parses_what_the_writers_write() -> None:
    key = join_key(layout.adapter_prefix("acme", "bot", 3), "adapter_config.json")
    found = layout.parse_adapter_key(key)
    assert found == layout.AdapterLocation("adapters/acme/bot/3", "bot", 3)
    assert layout.parse_adapter_key("adapters/acme/bot/x/f").version is None  # type: ignore[union-attr]
    assert layout.parse_adapter_key("models/tiny/abc/config.json") is None
    assert layout.job_of(join_key(layout.run_key("job-7", 1), "checkpoint_00000004/a")) == "job-7"
    assert layout.job_of(layout.output_result("job-7", 1)) == "job-7"
    assert layout.job_of("adapters/acme/bot/3/f") is None


@pytest.mark.parametrize(
    "key", ["", "/abs", "a/../b", "a//b", "./a", "a/\x00", "a\\b", "a/b/", "tab\there"]
)
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidKey):
        validate_key(key)


def test_a_prefix_may_end_with_a_slash() -> None:
    assert validate_key("adapters/acme/", prefix=True) == "adapters/acme/"
    with pytest.raises(InvalidKey):
        join_key("datasets", "..", "x")

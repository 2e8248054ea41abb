"""Which jobs are verified, over which steps, and when a replay matches: pure functions."""

from __future__ import annotations

import random

import pytest

from swarm_contracts.verification import ReplayReport
from swarm_scheduler.verdict import drawn, judge, loss_differences, pick_range


def report(**overrides: object) -> ReplayReport:
    base: dict[str, object] = {
        "from_step": 4,
        "to_step": 6,
        "distances": {"q.lora_A": 1e-7, "q.lora_B": 2e-6},
        "losses": {5: 2.0, 6: 1.5},
    }
    return ReplayReport.model_validate(base | overrides)


def test_a_fraction_of_jobs_is_drawn_and_none_at_zero() -> None:
    rng = random.Random(7)
    picks = sum(drawn(0.25, rng) for _ in range(4000))
    assert 800 < picks < 1200
    assert not any(drawn(0.0, rng) for _ in range(100))
    assert all(drawn(1.0, rng) for _ in range(100))


def test_a_range_runs_between_consecutive_committed_checkpoints() -> None:
    rng = random.Random(1)
    assert pick_range([6, 4], rng) == (4, 6)
    assert pick_range([4, 4], rng) is None  # one checkpoint: nowhere to compare
    assert pick_range([], rng) is None
    ranges = {pick_range([2, 4, 6, 8], rng) for _ in range(100)}
    assert ranges == {(2, 4), (4, 6), (6, 8)}


def test_loss_differences_are_relative_over_the_steps_both_have() -> None:
    assert loss_differences({5: 2.2, 6: 1.0, 7: 3.0}, {5: 2.0, 6: 0.0}) == {
        5: pytest.approx(0.1),
        6: 1.0,  # absolute against a zero loss
    }


def test_an_honest_replay_matches() -> None:
    verdict = judge(report(), {5: 2.0 + 1e-7, 6: 1.5}, tolerance=0.05, loss_tolerance=0.05)
    assert verdict.passed, verdict.reason
    assert verdict.worst_matrix == "q.lora_B"
    assert verdict.max_relative_l2 == pytest.approx(2e-6)
    assert verdict.max_loss_difference == pytest.approx(5e-8)
    assert "2 losses" in verdict.reason


def test_weights_beyond_the_tolerance_fail_and_name_the_matrix() -> None:
    verdict = judge(report(distances={"q.lora_A": 0.001, "v.lora_B": 0.4}), {}, 0.05, 0.05)
    assert not verdict.passed
    assert "v.lora_B is 0.4 away" in verdict.reason
    assert verdict.max_loss_difference is None  # nothing reported to compare


def test_losses_beyond_the_tolerance_fail_even_with_matching_weights() -> None:
    verdict = judge(report(), {5: 2.0, 6: 1.0}, tolerance=0.05, loss_tolerance=0.05)
    assert not verdict.passed
    assert "step 6 loss" in verdict.reason
    assert verdict.max_loss_difference == pytest.approx(0.5)


def test_a_missing_matrix_or_none_at_all_fails() -> None:
    assert not judge(report(missing=["k.lora_A"]), {}, 0.05, 0.05).passed
    assert not judge(report(distances={}), {}, 0.05, 0.05).passed

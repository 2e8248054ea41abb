"""A training session's forward pass (swarm_trainer.session): its data go through the model in
padded micro-batches, and that changes nothing but the speed: log-probabilities, losses and
gradients are those of one datum at a time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_contracts.jobs import ModelRef
from swarm_contracts.sessions import CreateSession, SessionDatum
from swarm_runtime.rpc import Refused
from swarm_trainer import session as session_module
from swarm_trainer.session import TrainingSession, micro_batches
from swarm_trainer.tiny_model import create_tiny_model


def test_micro_batches_pad_to_their_longest_within_the_budget() -> None:
    assert micro_batches([10, 10, 10, 10], budget=30) == [[0, 1, 2], [3]]
    # A longer datum raises the group's padded size: it starts a new group when it must.
    assert micro_batches([4, 4, 4, 20], budget=40) == [[0, 1, 2], [3]]
    assert micro_batches([4, 4, 20, 4], budget=40) == [[0, 1], [2, 3]]
    assert micro_batches([50, 3], budget=40) == [[0], [1]]  # too long alone: a group anyway
    assert micro_batches([], budget=40) == []


def _data() -> list[SessionDatum]:
    """Datums of different lengths, with RL inputs (a PPO loss uses them all)."""
    out = []
    for n in (5, 17, 9, 30, 2):
        tokens = [(7 * i + n) % 90 + 1 for i in range(n + 1)]
        out.append(
            SessionDatum(
                tokens=tokens[:-1],
                inputs={
                    "target_tokens": [float(t) for t in tokens[1:]],
                    "logprobs": [-4.0 - 0.01 * i for i in range(n)],
                    "advantages": [(-1.0) ** i for i in range(n)],
                },
            )
        )
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("session") / "tiny")


def _session(model_dir: Path) -> TrainingSession:
    ref = ModelRef(name="tiny", version=1, store_key="-", digest="-")
    return TrainingSession(CreateSession(base_model=ref, rank=4, seed=3), model_dir)


def test_a_batched_forward_backward_is_one_datum_at_a_time_s(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched, single = _session(model_dir), _session(model_dir)
    data = _data()
    together = batched.forward(data, "ppo", {}, backward=True)
    lengths = [len(d.tokens) for d in data]
    assert len(micro_batches(lengths, session_module.CPU_TOKENS_PER_FORWARD)) == 1  # one pass
    monkeypatch.setattr(session_module, "CPU_TOKENS_PER_FORWARD", 1)  # one datum per pass
    apart = single.forward(data, "ppo", {}, backward=True)

    assert together.metrics["loss:sum"] == pytest.approx(apart.metrics["loss:sum"], rel=1e-5)
    for a, b in zip(together.outputs, apart.outputs, strict=True):
        assert len(a["logprobs"]) == len(b["logprobs"])
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)
        assert a["elementwise_loss"] == pytest.approx(b["elementwise_loss"], abs=1e-5)
    grads = [(p.grad, q.grad) for p, q in zip(batched.params, single.params, strict=True)]
    assert all(g is not None and h is not None for g, h in grads)
    assert any(float(g.abs().sum()) > 0 for g, _ in grads)  # type: ignore[union-attr]
    for g, h in grads:
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)


def _rl_datum(sampled: list[float], advantages: list[float]) -> SessionDatum:
    n = len(sampled)
    return SessionDatum(
        tokens=[1] * n,
        inputs={"target_tokens": [2.0] * n, "logprobs": sampled, "advantages": advantages},
    )


def test_cispo_weights_each_token_by_its_clipped_ratio_with_no_gradient_through_it(
    model_dir: Path,
) -> None:
    session = _session(model_dir)
    logprobs = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    # ratios exp(lp - q): e^2 (capped at 4 by default), e^-1, e^0.
    datum = _rl_datum([-3.0, -1.0, -0.5], [1.0, -2.0, 0.5])
    loss = session._loss("cispo", datum, logprobs, {})
    ratios = torch.tensor([4.0, float(torch.exp(torch.tensor(-1.0))), 1.0])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    torch.testing.assert_close(loss, -ratios * logprobs.detach() * advantages)
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, -ratios * advantages)  # the ratio is a constant
    capped = session._loss("cispo", datum, logprobs, {"clip_high_threshold": 2.0})
    assert float(capped[0]) == pytest.approx(-2.0 * -1.0 * 1.0)


def test_dro_penalises_the_squared_log_ratio_and_needs_its_beta(model_dir: Path) -> None:
    session = _session(model_dir)
    logprobs = torch.tensor([-1.0, -2.0], requires_grad=True)
    datum = _rl_datum([-1.5, -2.0], [2.0, -1.0])
    loss = session._loss("dro", datum, logprobs, {"beta": 0.1})
    expected = -(torch.tensor([-2.0, 2.0]) - 0.05 * torch.tensor([0.25, 0.0]))
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    # d/dlp of -(lp * A - beta/2 (lp - q)^2) = -(A - beta (lp - q))
    torch.testing.assert_close(
        logprobs.grad, -(torch.tensor([2.0, -1.0]) - 0.1 * torch.tensor([0.5, 0.0]))
    )
    with pytest.raises(Refused, match=r"loss_fn_config\.beta"):
        session._loss("dro", datum, logprobs, {})

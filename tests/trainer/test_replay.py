"""A replay's comparison maths, the dishonest worker's perturbation it must catch, and the
other hooks an agent can be told to run."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from swarm_trainer.hooks import PerturbCheckpoints, SlowSteps, agent_hooks
from swarm_trainer.replay import relative_l2
from swarm_trainer.train_state import TrainState


def test_relative_l2_per_matrix() -> None:
    theirs = {"a": torch.tensor([3.0, 4.0]), "b": torch.zeros(2), "c": torch.ones(3)}
    ours = {
        "a": torch.tensor([3.0, 4.5]).to(torch.bfloat16),  # compared in fp32 all the same
        "b": torch.tensor([0.0, 0.25]),
        "c": torch.ones(4),  # another shape
        "d": torch.ones(1),  # not theirs
    }
    distances, missing = relative_l2(ours, theirs)
    assert distances == {"a": pytest.approx(0.1), "b": pytest.approx(0.25)}  # b: absolute
    assert missing == ["c", "d"]
    same, none = relative_l2(theirs, {k: v.clone() for k, v in theirs.items()})
    assert same == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert none == []


class Lora(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lora_A = torch.nn.Parameter(torch.randn(4, 8))
        self.lora_B = torch.nn.Parameter(torch.zeros(8, 4))
        self.base = torch.nn.Parameter(torch.ones(3))


def test_the_dishonest_hook_moves_every_lora_matrix_and_nothing_else() -> None:
    model = Lora()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    recipe: Any = SimpleNamespace(peft_model=model)
    rng_state = torch.get_rng_state()
    PerturbCheckpoints(scale=0.5).before_checkpoint(recipe, TrainState(step=4))
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    distances, _ = relative_l2(after, before)
    assert distances["lora_A"] == pytest.approx(0.5, rel=1e-4)
    assert distances["lora_B"] > 0  # zero before: moved all the same
    assert distances["base"] == 0.0
    assert torch.equal(torch.get_rng_state(), rng_state)  # the run's RNG stream untouched


def test_an_agent_hook_is_named_or_refused() -> None:
    assert agent_hooks("") is None
    assert isinstance(agent_hooks("perturb_checkpoints"), PerturbCheckpoints)
    slow = agent_hooks("slow_steps")
    assert isinstance(slow, SlowSteps)
    started = time.monotonic()
    slow.before_step(cast(Any, None), TrainState(step=0))
    assert time.monotonic() - started >= slow.seconds
    with pytest.raises(ValueError, match="unknown trainer test hook"):
        agent_hooks("nope")

"""The stock ``tinker`` SDK against the real stack (docs/tinker.md): a LoRA training session on
the stack's trainer, driven call by call over the gateway's Tinker API."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import tinker
from tinker import types

from .conftest import Stack

pytestmark = pytest.mark.slow

TOKENS = [5, 17, 42, 99, 7, 250, 31, 8, 64, 128, 3, 77, 19, 200, 11, 45]


def _datum() -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(TOKENS[1:], dtype=np.int64),
            "weights": np.ones(len(TOKENS) - 1, dtype=np.float32),
        },
    )


def _logprobs(client: tinker.TrainingClient) -> list[float]:
    out = client.forward([_datum()], "cross_entropy").result(timeout=60)
    values: list[float] = out.loss_fn_outputs[0]["logprobs"].tolist()
    return values


def _wait_for_the_trainer(stack: Stack) -> None:
    # The stack answers before its trainer (Ray, torch) is up: a session needs one.
    deadline = time.monotonic() + 180
    while not any(w.state == "alive" for w in stack.client.workers()):
        assert time.monotonic() < deadline, "the stack's trainer never came up"
        time.sleep(0.5)


def test_the_stock_sdk_trains_a_lora_session_and_its_state_round_trips(stack: Stack) -> None:
    _wait_for_the_trainer(stack)
    service = tinker.ServiceClient(base_url=stack.local.gateway_url, api_key="tml-local")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=4, seed=0).result(
        timeout=120
    )
    assert training.get_info().lora_rank == 4

    losses = []
    for _ in range(4):
        # Both submitted before either is awaited: the session runs them in order.
        fwd_bwd = training.forward_backward([_datum()], "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=1e-2))
        out = fwd_bwd.result(timeout=60)
        step.result(timeout=60)
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(TOKENS) - 1
        losses.append(out.metrics["loss:sum"])
    assert all(b < a for a, b in itertools.pairwise(losses)), losses

    saved = training.save_state("after-4").result(timeout=60).path
    assert saved == f"tinker://{training.model_id}/weights/after-4"
    before = _logprobs(training)
    training.forward_backward([_datum()], "cross_entropy").result(timeout=60)
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    assert _logprobs(training) != before  # the extra step moved the weights

    training.load_state_with_optimizer(saved).result(timeout=60)
    assert _logprobs(training) == before  # bit for bit (fp32 on CPU)

    # Bad input is the SDK's error, naming what is wrong; the session goes on.
    with pytest.raises(tinker.BadRequestError, match="loss_fn"):
        training.forward_backward([_datum()], "dro").result(timeout=60)
    with pytest.raises(tinker.RequestFailedError, match="no forward_backward"):
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)
    assert _logprobs(training) == before

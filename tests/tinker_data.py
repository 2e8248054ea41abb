"""What the Tinker tests (tests/e2e/test_tinker.py, tests/faults/test_tinker_restore.py) train
on: one fixed sequence, and the log-probabilities a training client gives it."""

from __future__ import annotations

import numpy as np
import tinker
from tinker import types

TOKENS = [5, 17, 42, 99, 7, 250, 31, 8, 64, 128, 3, 77, 19, 200, 11, 45]


def datum(tokens: list[int] = TOKENS) -> types.Datum:
    """``tokens`` as a cross_entropy datum: each next token, weight 1."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


def logprobs(client: tinker.TrainingClient, timeout: float = 120) -> list[float]:
    out = client.forward([datum()], "cross_entropy").result(timeout=timeout)
    values: list[float] = out.loss_fn_outputs[0]["logprobs"].tolist()
    return values

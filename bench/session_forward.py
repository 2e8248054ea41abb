"""A training session's ``forward_backward`` (swarm_trainer.session): its data in padded
micro-batches (``CPU_TOKENS_PER_FORWARD`` tokens a pass, as a CPU runs them) against one datum a
pass, as sessions ran before, on the same session and data, alternating (A B A B), median of
``--repeats``.

    .venv/bin/python bench/session_forward.py [--repeats 5] [--threads 1]

Three shapes: an RL batch (32 samples x 64 tokens), 16 x 200, and the issue's 100 ms step
(8 x 500).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from swarm_contracts.jobs import ModelRef
from swarm_contracts.sessions import CreateSession, SessionDatum
from swarm_trainer import session as session_module
from swarm_trainer.tiny_model import create_tiny_model

SHAPES = ((32, 64), (16, 200), (8, 500))


def data(n: int, length: int) -> list[SessionDatum]:
    out = []
    for k in range(n):
        tokens = [(7 * i + k) % 400 + 1 for i in range(length + 1)]
        inputs = {"target_tokens": [float(t) for t in tokens[1:]], "weights": [1.0] * length}
        out.append(SessionDatum(tokens=tokens[:-1], inputs=inputs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trainer's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(Path(tmp) / "tiny")
        ref = ModelRef(name="tiny", version=1, store_key="-", digest="-")
        session = session_module.TrainingSession(
            CreateSession(base_model=ref, rank=4, seed=0), model_dir
        )
        batched_budget = session_module.CPU_TOKENS_PER_FORWARD
        for n, length in SHAPES:
            batch = data(n, length)
            times: dict[str, list[float]] = {"batched": [], "one datum a pass": []}
            for _ in range(args.repeats + 1):  # the first round warms up
                for name, budget in (("batched", batched_budget), ("one datum a pass", 1)):
                    session_module.CPU_TOKENS_PER_FORWARD = budget
                    start = time.perf_counter()
                    session.forward(batch, "cross_entropy", {}, backward=True)
                    times[name].append(time.perf_counter() - start)
                    session.model.zero_grad(set_to_none=True)
            batched = statistics.median(times["batched"][1:])
            single = statistics.median(times["one datum a pass"][1:])
            print(
                f"{n} x {length} tokens: batched {batched * 1e3:.1f} ms, one datum a pass "
                f"{single * 1e3:.1f} ms: {single / batched:.2f}x faster"
            )


if __name__ == "__main__":
    main()

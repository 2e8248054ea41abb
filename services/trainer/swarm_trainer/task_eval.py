"""Task evals: generate from the adapter on held-out prompts, greedily and in batches, and grade
what it wrote (``graders``).

The prompt is exactly what training conditioned on (``methods.sft.encode_example``: BOS, then the
prompt, or the chat turns before the last assistant one and its ``assistant: `` header), so
the adapter is asked as it was taught. Generation is the inference engine's own batched
generation (``swarm_generation.batch.generate``: the same prefill, KV-cache splicing, decode
steps and token choice), run on the in-training PEFT model in memory; a row that ends makes
room for the next prompt at once. The answer graded is the completion's tokens decoded on
their own (special tokens dropped), as transformers' ``generate`` and ``decode`` give it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarm_contracts.evals import EvalResult, EvalSample, EvalSpec
from swarm_generation.batch import generate as batched_generate
from swarm_generation.sampling import SamplingParams
from swarm_trainer.data import DatasetError
from swarm_trainer.graders import grade

GENERATE_BATCH = 32  # rows generated together


@dataclass(frozen=True)
class EvalRow:
    prompt: str
    expected: str


def eval_row(record: dict[str, Any]) -> EvalRow | None:
    """The (prompt, expected answer) of a prompt/completion or chat record, or of a preference
    pair (its chosen answer); None for plain text, which has no answer to grade."""
    if "prompt" in record and "completion" in record:
        return EvalRow(str(record["prompt"]), str(record["completion"]))
    if "chosen" in record or "preferred_output" in record:
        return preference_row(record)
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "assistant":
            return None
        context = "".join(
            f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages[:-1]
        )
        return EvalRow(context + "assistant: ", str(last.get("content", "")))
    return None


def preference_row(record: dict[str, Any]) -> EvalRow | None:
    """A DPO record graded on its chosen answer: ``{"prompt", "chosen"}`` as strings, or the
    chat and OpenAI forms, whose chosen answer is an assistant turn."""
    prompt = record.get("prompt")
    chosen = record.get("chosen")
    if isinstance(prompt, str) and isinstance(chosen, str):
        return EvalRow(prompt, chosen)
    source = record.get("input")
    if isinstance(source, dict):
        prompt, chosen = source.get("messages"), record.get("preferred_output")
    if isinstance(chosen, str):
        chosen = [{"role": "assistant", "content": chosen}]
    if not isinstance(prompt, list) or not isinstance(chosen, list) or not chosen:
        return None
    return eval_row({"messages": [*prompt, chosen[-1]]})


def eval_rows(records: Sequence[dict[str, Any]], limit: int) -> list[EvalRow]:
    rows = [r for record in records if (r := eval_row(record)) is not None][:limit]
    if not rows:
        raise DatasetError(
            "the eval set has no prompt/completion or chat row ending in an assistant turn to grade"
        )
    return rows


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    device: torch.device,
    bf16: bool = False,
) -> list[str]:
    """Greedy completions of ``prompts`` (special tokens dropped), ``GENERATE_BATCH`` rows at a
    time; each ends at an end-of-sequence token or ``max_new_tokens``."""
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    # BOS always, as ``methods.sft.encode_segments`` puts it before every example.
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    was_training = model.training
    model.eval()
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    )
    try:
        with autocast:
            completions = batched_generate(
                model,
                tokenizer,
                [bos + tokenizer.encode(p, add_special_tokens=False) for p in prompts],
                params,
                device,
                max_batch_size=GENERATE_BATCH,
            )
    finally:
        model.train(was_training)
    return [tokenizer.decode(list(c.tokens), skip_special_tokens=True) for c in completions]


def run_evals(
    model: Any,
    tokenizer: Any,
    spec: EvalSpec,
    rows: Sequence[EvalRow],
    step: int,
    device: torch.device,
    bf16: bool = False,
) -> EvalResult:
    started = time.monotonic()
    got = generate(model, tokenizer, [r.prompt for r in rows], spec.max_new_tokens, device, bf16)
    return score(spec, rows, got, step, time.monotonic() - started)


def score(
    spec: EvalSpec, rows: Sequence[EvalRow], got: Sequence[str], step: int, eval_s: float = 0.0
) -> EvalResult:
    """Each grader's pass rate over the rows, and the first ``spec.samples`` rows graded."""
    totals = dict.fromkeys(spec.metrics, 0.0)
    samples: list[EvalSample] = []
    for row, output in zip(rows, got, strict=True):
        graded = grade(spec.graders, output, row.expected)
        for metric, value in graded.scores.items():
            totals[metric] += value
        if len(samples) < spec.samples:
            samples.append(
                EvalSample(
                    prompt=row.prompt,
                    expected=row.expected,
                    got=output,
                    scores=graded.scores,
                    errors=graded.errors,
                )
            )
    n = max(len(rows), 1)
    return EvalResult(
        step=step,
        metrics={metric: total / n for metric, total in totals.items()},
        examples=len(rows),
        samples=samples,
        eval_s=eval_s,
    )

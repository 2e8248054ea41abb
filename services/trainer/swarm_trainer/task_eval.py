"""Task evals: generate from the adapter on held-out prompts, greedily and in batches, and grade
what it wrote (``graders``).

The prompt is exactly what training conditioned on (``methods.sft.encode_example``: BOS, then the
prompt, or the chat turns before the last assistant one and its ``assistant: `` header), so
the adapter is asked as it was taught. Generation is transformers' ``generate`` with greedy
decoding over left-padded rows: one well-kept implementation with a KV cache, rather than a
copy of the inference engine's sampling code.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarm_contracts.evals import EvalResult, EvalSample, EvalSpec
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


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    device: torch.device,
    bf16: bool = False,
) -> list[str]:
    """Greedy completions of ``prompts`` (special tokens dropped), ``GENERATE_BATCH`` at a time."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    outputs: list[str] = []
    was_training = model.training
    model.eval()
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    )
    try:
        for start in range(0, len(prompts), GENERATE_BATCH):
            encoded = [
                bos + tokenizer.encode(p, add_special_tokens=False)
                for p in prompts[start : start + GENERATE_BATCH]
            ]
            width = max(len(ids) for ids in encoded)
            # Left-padded, so every row's next token is at the last position.
            input_ids = torch.tensor([[pad_id] * (width - len(i)) + i for i in encoded])
            mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in encoded])
            with autocast:
                out = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            outputs.extend(
                tokenizer.decode(row[width:], skip_special_tokens=True) for row in out.cpu()
            )
    finally:
        model.train(was_training)
    return outputs


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

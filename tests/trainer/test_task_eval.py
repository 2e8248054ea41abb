"""Task evals generate with the inference engine's batch (``swarm_generation``) on the model
being trained, in memory: the answers are the ones transformers' greedy ``generate`` gives
(what the evals ran on before), row for row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer.model import build_model
from swarm_trainer.task_eval import GENERATE_BATCH, generate

from ..greedy_reference import transformers_greedy

CPU = torch.device("cpu")
MAX_NEW = 8


@pytest.fixture(scope="module")
def peft_model(tiny_model_dir: Path) -> Any:
    """The trainer's own model (PEFT LoRA, its attention and kernels), with LoRA weights far
    enough from zero to change what it writes, in training mode as a validation finds it."""
    torch.manual_seed(0)
    model = build_model(tiny_model_dir, LoraSpec(r=4, dropout=0.0), TrainingSpec())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.4)
    return model.train()


def prompts() -> list[str]:
    """More than one batch, of many lengths."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    return [f"Question {i}: {' '.join(words[: i % 9])}? Answer:" for i in range(GENERATE_BATCH + 9)]


def transformers_generate(model: Any, tokenizer: Any, texts: list[str]) -> list[str]:
    """What the evals did before: transformers' greedy ``generate`` on left-padded batches of
    ``GENERATE_BATCH``, each answer decoded on its own."""
    model.eval()
    answers = []
    for start in range(0, len(texts), GENERATE_BATCH):
        encoded = [
            [tokenizer.bos_token_id, *tokenizer.encode(p, add_special_tokens=False)]
            for p in texts[start : start + GENERATE_BATCH]
        ]
        rows = transformers_greedy(
            model, encoded, MAX_NEW, tokenizer.pad_token_id, [tokenizer.eos_token_id]
        )
        answers.extend(tokenizer.decode(row, skip_special_tokens=True) for row in rows)
    model.train()
    return answers


def test_eval_answers_are_transformers_greedy_ones_on_the_peft_model(
    peft_model: Any, tokenizer: Any
) -> None:
    texts = prompts()
    got = generate(peft_model, tokenizer, texts, MAX_NEW, CPU)
    assert peft_model.training, "the model goes back to training mode"
    assert got == transformers_generate(peft_model, tokenizer, texts)
    assert len(set(got)) > 1


def test_bf16_autocast_generates_every_answer(peft_model: Any, tokenizer: Any) -> None:
    got = generate(peft_model, tokenizer, prompts()[:5], MAX_NEW, CPU, bf16=True)
    assert len(got) == 5
    assert all(isinstance(answer, str) for answer in got)
    assert peft_model.training

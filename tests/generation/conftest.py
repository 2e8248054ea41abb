"""Generation fixtures: the tiny random Llama and its byte-level BPE tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm_trainer.tiny_model import create_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, use_safetensors=True).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)

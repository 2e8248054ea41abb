"""Inference fixtures: the tiny model, two PEFT adapters with non-trivial weights, an engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm_inference.adapter_files import AdapterSource, digests_of
from swarm_inference.base_model import load_base_model
from swarm_inference.engine import Engine
from swarm_trainer.tiny_model import create_tiny_model

ADAPTERS = {
    # name: (rank, target modules): different ranks and targets share one batch.
    "qv": (4, ["q_proj", "v_proj"]),
    "all": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "mlp": (2, ["up_proj", "down_proj"]),
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def make_adapter(base_dir: Path, out: Path, rank: int, targets: list[str], seed: int) -> Path:
    """A PEFT LoRA saved by peft itself, with B drawn large enough to change greedy outputs
    (peft initialises B to zero, which would make every adapter equal the base model)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, use_safetensors=True)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.4)
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(tiny_model_dir, root / name, rank, targets, seed)
        for seed, (name, (rank, targets)) in enumerate(ADAPTERS.items())
    }


@pytest.fixture(scope="session")
def sources(adapter_dirs: dict[str, Path]) -> dict[str, AdapterSource]:
    return {
        name: AdapterSource(name, path, digests_of(path)) for name, path in adapter_dirs.items()
    }


@pytest.fixture(scope="session")
def base(tiny_model_dir: Path) -> tuple[Any, Any]:
    return load_base_model(tiny_model_dir, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def engine(base: tuple[Any, Any]) -> Iterator[Engine]:
    model, tokenizer = base
    with Engine(model, tokenizer, max_batch_size=8, max_wait_s=0.01, adapter_slots=4) as engine:
        yield engine

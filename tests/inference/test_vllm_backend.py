"""The optional vLLM backend: refused clearly where it cannot run, checked where it can."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarm_generation.sampling import SamplingParams
from swarm_inference.engine import Engine
from swarm_inference.vllm_backend import BackendUnavailable, VllmEngine, unavailable_reason

REASON = unavailable_reason()


@pytest.mark.skipif(REASON is None, reason="vLLM can run here: the refusal is not what happens")
def test_without_vllm_or_a_gpu_the_backend_says_why(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(BackendUnavailable, match=r"vLLM is not installed|needs a CUDA GPU"):
        VllmEngine(tiny_model_dir, tokenizer, max_batch_size=4, adapter_slots=2)


@pytest.mark.skipif(REASON is not None, reason=f"vLLM backend unavailable: {REASON}")
def test_vllm_answers_as_the_batched_engine(
    tiny_model_dir: Path, engine: Engine, sources: dict
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    vllm = VllmEngine(tiny_model_dir, tokenizer, max_batch_size=8, adapter_slots=4, dtype="float32")
    try:
        greedy = SamplingParams(max_tokens=12, temperature=0)
        ids = engine.encode("The quick brown")

        async def both(adapter: object) -> tuple[str, str]:
            ours = await engine.complete(ids, greedy, adapter)  # type: ignore[arg-type]
            parts = [p.text async for p in vllm.generate(ids, greedy, adapter)]  # type: ignore[arg-type]
            return ours.text, "".join(parts)

        for adapter in (None, sources["qv"], sources["all"]):
            ours, theirs = asyncio.run(both(adapter))
            assert ours == theirs
    finally:
        vllm.stop()

"""Optional backend: vLLM's multi-LoRA engine, for GPU workers where vLLM is installed.

``SWARM_INFERENCE_BACKEND=vllm`` makes the worker serve its base models with vLLM instead of
``swarm_inference.engine`` (``pip install 'swarm-inference[vllm]'`` on a CUDA machine; the
Dockerfile takes ``--build-arg EXTRAS=[vllm]``). Everything around it is unchanged: the same
subjects, the same chunks, adapters resolved and fetched by the worker and checked against
the registry's sha256 before vLLM reads them, base weights loaded as safetensors only
(``load_format="safetensors"``). vLLM batches, pages the KV cache and keeps its own LRU of
LoRA adapters (``max_loras`` = ``SWARM_INFERENCE_ADAPTER_SLOTS``).

Nothing here imports vLLM until a ``VllmEngine`` is made, so the module loads anywhere; on a
machine without vLLM or without a GPU, making one raises ``BackendUnavailable`` saying so.
"""

from __future__ import annotations

import importlib.util
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from swarm_generation.batch import encode_prompt, scores_prompt
from swarm_generation.sampling import SamplingParams
from swarm_inference.adapter_files import CONFIG_FILE, WEIGHTS_FILE, AdapterSource, verified
from swarm_inference.engine import (
    EngineStats,
    InvalidRequest,
    Piece,
    check_prompt,
)


class BackendUnavailable(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why the vLLM backend cannot run here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'swarm-inference[vllm]' on a GPU worker)"
    import torch

    if not torch.cuda.is_available():
        return "the vLLM backend needs a CUDA GPU"
    return None


class VllmEngine:
    """The ``Engine`` surface the worker uses (``encode``, ``check``, ``generate``,
    ``stats``, ``stop``, ``tokenizer``, ``max_context``), on vLLM's ``AsyncLLMEngine``."""

    def __init__(
        self,
        model_dir: Path,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int,
        adapter_slots: int,
        max_lora_rank: int = 64,
        dtype: str = "auto",
    ) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(reason)
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        args = AsyncEngineArgs(
            model=str(model_dir),
            tokenizer=str(model_dir),
            load_format="safetensors",
            dtype=dtype,
            enable_lora=True,
            max_loras=adapter_slots,
            max_lora_rank=max_lora_rank,
            max_num_seqs=max_batch_size,
            trust_remote_code=False,
        )
        self.engine: Any = AsyncLLMEngine.from_engine_args(args)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.adapter_slots = adapter_slots
        self.max_context: int | None = getattr(
            self.engine.model_config if hasattr(self.engine, "model_config") else None,
            "max_model_len",
            None,
        )
        self._lora_ids: dict[str, int] = {}
        self._next_id = itertools.count(1)
        self._open = 0
        self.generated_tokens = 0

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        check_prompt(prompt_ids, params, self.max_context)

    def _lora(self, adapter: AdapterSource) -> Any:
        from vllm.lora.request import LoRARequest

        lora_id = self._lora_ids.get(adapter.key)
        if lora_id is None:
            # The same digests as the batched engine checks, before vLLM reads the files.
            verified(adapter, CONFIG_FILE)
            verified(adapter, WEIGHTS_FILE)
            lora_id = self._lora_ids[adapter.key] = next(self._next_id)
        return LoRARequest(adapter.key, lora_id, str(adapter.path))

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: AdapterSource | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> AsyncIterator[Piece]:
        from vllm import SamplingParams as VllmSampling

        self.check(prompt_ids, params)
        if json_schema is not None:
            # vLLM's structured-output options change between its releases; until one is
            # pinned and tested here, JSON formats are the batched engine's only.
            raise InvalidRequest("response_format json is not supported by the vLLM backend")
        # vLLM's prompt logprobs are each position's top-k and the prompt's own token: neither
        # chosen ids nor draws; the batched engine serves those.
        if params.prompt_targets is not None:
            raise InvalidRequest("prompt_target_ids are not supported by the vLLM backend")
        if params.prompt_alt_tokens:
            raise InvalidRequest("prompt_alt_tokens are not supported by the vLLM backend")
        # Our stop_tokens replace the end-of-sequence ones; vLLM's stop_token_ids add to them.
        replace_eos = params.ignore_eos or params.stop_tokens is not None
        sampling = VllmSampling(
            n=1,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_tokens or ()) or None,
            ignore_eos=replace_eos,
            # k: the k most likely and the sampled token's own (0: the latter only).
            logprobs=params.top_logprobs if params.logprobs or params.top_logprobs else None,
            prompt_logprobs=(params.prompt_top_logprobs if scores_prompt(params) else None),
        )
        request_id = uuid.uuid4().hex
        lora = self._lora(adapter) if adapter is not None else None
        shown = 0
        self._open += 1
        try:
            async for output in self.engine.generate(
                {"prompt_token_ids": prompt_ids}, sampling, request_id, lora_request=lora
            ):
                completion = output.outputs[0]
                text = completion.text  # cumulative
                finish = None
                if output.finished:  # vLLM says "length", or "stop" (EOS or a stop string)
                    finish = "length" if completion.finish_reason == "length" else "stop"
                if finish is not None:
                    tokens = tuple(completion.token_ids)
                    logprobs = None
                    if params.logprobs and completion.logprobs is not None:
                        logprobs = tuple(
                            float(step[token].logprob)
                            for step, token in zip(completion.logprobs, tokens, strict=True)
                        )
                    prompt = None
                    if params.prompt_logprobs and output.prompt_logprobs is not None:
                        prompt = tuple(
                            float("nan") if step is None else float(step[token].logprob)
                            for step, token in zip(output.prompt_logprobs, prompt_ids, strict=True)
                        )
                    yield Piece(
                        text[shown:],
                        len(tokens),
                        len(prompt_ids),
                        finish,
                        tokens,
                        logprobs,
                        prompt,
                        top_logprobs=_tops(completion.logprobs, params.top_logprobs),
                        prompt_top_logprobs=_tops(
                            output.prompt_logprobs, params.prompt_top_logprobs
                        ),
                    )
                elif len(text) > shown:
                    yield Piece(text[shown:], len(completion.token_ids), len(prompt_ids))
                    shown = len(text)
                if output.finished:
                    self.generated_tokens += len(completion.token_ids)
                    return
        finally:
            self._open -= 1
            await self.engine.abort(request_id)  # a no-op once finished

    def stats(self) -> EngineStats:
        loaded = list(self._lora_ids)[-self.adapter_slots :]
        return EngineStats(
            running=self._open,
            queued=0,  # vLLM's scheduler queue is its own
            adapters_loaded=loaded,
            free_slots=max(0, self.adapter_slots - len(loaded)),
            adapter_slots=self.adapter_slots,
            steps=0,
            generated_tokens=self.generated_tokens,
            mixed_forwards=0,
        )

    def stop(self, timeout: float = 30.0) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _tops(steps: Any, k: int) -> Any:
    """vLLM's per-position ``{token id: Logprob}`` (None where it has none) as each
    position's k most likely (id, log-probability), best first; None when not asked. vLLM's
    are under the model's own distribution, not the temperature-scaled one."""
    if k <= 0 or steps is None:
        return None
    tops: list[list[tuple[int, float]] | None] = []
    for step in steps:
        if step is None:
            tops.append(None)
            continue
        ranked = sorted(((int(t), float(p.logprob)) for t, p in step.items()), key=lambda x: -x[1])
        tops.append(ranked[:k])
    return tops

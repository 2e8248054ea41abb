"""Multi-adapter serving: Swarm's batched engine vs one request at a time vs merged copies.

For K adapters (1, 8, 32) and M requests that arrive together (spread round-robin over the
adapters), three ways to serve the same work on one random Llama (hidden 512, 4 layers, the
tiny tokenizer):

* swarm   -- ``swarm_inference.engine.Engine``: continuous batching, every adapter in one
             batch through the per-row LoRA slots (max batch 32, K adapter slots);
* serial  -- (a) the same engine, one request at a time (no batching);
* merged  -- (b) each adapter merged into its own copy of the base model (peft
             ``merge_and_unload``), requests served one by one with transformers' ``generate``.

With ``--json-format`` a fourth side, swarm+json, is the swarm side with every request under
``response_format`` json_schema (``JSON_SCHEMA``: a string that cannot close within the
tokens, so the work stays equal): the cost of the per-row token mask (lm-format-enforcer).

Every request generates exactly ``--tokens`` tokens (EOS ignored, greedy), so every side does
the same work. Latency is from the common arrival time to the request's last token, so a
side that serves one at a time shows its queueing in p50/p99. Sides run interleaved
(swarm, serial, merged, swarm, ...) ``--repeats`` times; each number is the median of its
repeats and each ratio is the median of the per-repeat ratios. The engine is measured
in-process (the serving core; NATS and HTTP add the same per-request cost to every side).

    .venv/bin/python bench/inference.py [--adapters 1 8 32] [--requests 64] [--device cuda]
        [--json-format]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SEED = 0
PROMPT_TOKENS = 16
# Never complete within a run's tokens: every constrained request generates all of them.
JSON_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1000}},
    "required": ["answer"],
}


def make_base(out: Path) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    from swarm_trainer.tiny_model import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_adapters(base_dir: Path, root: Path, count: int) -> list[Path]:
    """``count`` rank-8 LoRA adapters on q/k/v/o with random (non-zero) B, saved by peft."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    dirs = []
    for i in range(count):
        torch.manual_seed(1000 + i)
        model = AutoModelForCausalLM.from_pretrained(base_dir, use_safetensors=True)
        peft_model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0)
        )
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.02)
        out = root / f"adapter-{i:02d}"
        peft_model.save_pretrained(out)
        dirs.append(out)
    return dirs


@dataclass
class Run:
    seconds: float
    latencies: list[float]
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def prompts(tokenizer: Any, count: int) -> list[list[int]]:
    words = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "swarm", "adapters")
    out = []
    for i in range(count):
        text = " ".join(words[(i + j) % len(words)] for j in range(PROMPT_TOKENS))
        ids = tokenizer.encode(text, add_special_tokens=False)[: PROMPT_TOKENS - 1]
        out.append([tokenizer.bos_token_id, *ids])
    return out


async def run_engine(
    engine: Any,
    work: list[tuple[list[int], Any]],
    tokens: int,
    batched: bool,
    json_schema: dict[str, Any] | None = None,
) -> Run:
    from swarm_generation.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(ids: list[int], adapter: Any) -> None:
        piece = await engine.complete(ids, params, adapter, json_schema)
        assert piece.completion_tokens == tokens
        latencies.append(time.perf_counter() - start)

    if batched:
        await asyncio.gather(*(one(ids, adapter) for ids, adapter in work))
    else:
        for ids, adapter in work:
            await one(ids, adapter)
    return Run(time.perf_counter() - start, latencies, tokens * len(work))


def run_merged(
    models: list[Any], work: list[tuple[list[int], int]], tokens: int, device: Any
) -> Run:
    latencies = []
    start = time.perf_counter()
    with torch.no_grad():
        for ids, k in work:
            out = models[k].generate(
                torch.tensor([ids], device=device),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
            )
            assert out.shape[1] - len(ids) == tokens
            if device.type == "cuda":
                torch.cuda.synchronize()
            latencies.append(time.perf_counter() - start)
    return Run(time.perf_counter() - start, latencies, tokens * len(work))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=64, help="M: requests per run")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--json-format", action="store_true", help="add swarm+json: every request constrained"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from swarm_inference.adapter_files import AdapterSource, digests_of
    from swarm_inference.base_model import load_base_model, pick_dtype
    from swarm_inference.engine import Engine

    dtype = pick_dtype(device)
    results: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"torch threads, torch {torch.__version__}",
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "max_batch": args.max_batch,
        "repeats": args.repeats,
        "json_schema": JSON_SCHEMA if args.json_format else None,
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="swarm-bench-inference-") as tmp:
        root = Path(tmp)
        params = make_base(root / "base")
        results["model"] = f"random Llama, hidden 512, 4 layers, {params / 1e6:.1f}M parameters"
        adapter_dirs = make_adapters(root / "base", root, max(args.adapters))
        print(f"{results['model']}; {results['device']} {results['dtype']}; {results['machine']}")
        print(
            f"M={args.requests} requests x {args.tokens} tokens, prompt {PROMPT_TOKENS} tokens, "
            f"rank-8 LoRA on q/k/v/o, {args.repeats} interleaved repeats"
        )
        for k in args.adapters:
            model, tokenizer = load_base_model(root / "base", device, dtype)
            engine = Engine(model, tokenizer, max_batch_size=args.max_batch, adapter_slots=k)
            engine.start()
            sources = [AdapterSource(d.name, d, digests_of(d)) for d in adapter_dirs[:k]]
            ids = prompts(tokenizer, args.requests)
            work = [(ids[i], sources[i % k]) for i in range(args.requests)]
            merged_work = [(ids[i], i % k) for i in range(args.requests)]
            merged = []
            base = AutoModelForCausalLM.from_pretrained(
                root / "base", use_safetensors=True, dtype=dtype
            )
            for d in adapter_dirs[:k]:
                merged.append(
                    PeftModel.from_pretrained(copy.deepcopy(base), d)
                    .merge_and_unload()
                    .to(device)
                    .eval()
                )
            # Warm-up: adapters into their slots, kernels chosen, caches touched.
            asyncio.run(run_engine(engine, work[: min(len(work), args.max_batch)], 2, True))
            run_merged(merged, merged_work[:2], 2, device)
            if args.json_format:  # and the vocabulary's prefix tree built
                asyncio.run(run_engine(engine, work[:1], 2, True, JSON_SCHEMA))

            runs: dict[str, list[Run]] = {"swarm": [], "serial": [], "merged": []}
            if args.json_format:
                runs["swarm+json"] = []
            for _ in range(args.repeats):
                runs["swarm"].append(asyncio.run(run_engine(engine, work, args.tokens, True)))
                if args.json_format:
                    runs["swarm+json"].append(
                        asyncio.run(run_engine(engine, work, args.tokens, True, JSON_SCHEMA))
                    )
                runs["serial"].append(asyncio.run(run_engine(engine, work, args.tokens, False)))
                runs["merged"].append(run_merged(merged, merged_work, args.tokens, device))
            engine.stop()
            row: dict[str, Any] = {"adapters": k}
            for side, side_runs in runs.items():
                row[side] = {
                    "tokens_per_s": statistics.median(r.tokens_per_s for r in side_runs),
                    "p50_s": statistics.median(r.percentile(0.5) for r in side_runs),
                    "p99_s": statistics.median(r.percentile(0.99) for r in side_runs),
                }
            for peer in [p for p in runs if p != "swarm"]:
                row[f"x_vs_{peer}"] = statistics.median(
                    s.tokens_per_s / p.tokens_per_s
                    for s, p in zip(runs["swarm"], runs[peer], strict=True)
                )
            results["rows"].append(row)
            del merged, base, model, engine
            print(
                f"K={k:>2}: tokens/s swarm {row['swarm']['tokens_per_s']:8.1f}  "
                f"serial {row['serial']['tokens_per_s']:7.1f}  "
                f"merged {row['merged']['tokens_per_s']:7.1f}  |  p50/p99 s: "
                f"swarm {row['swarm']['p50_s']:.2f}/{row['swarm']['p99_s']:.2f}  "
                f"serial {row['serial']['p50_s']:.2f}/{row['serial']['p99_s']:.2f}  "
                f"merged {row['merged']['p50_s']:.2f}/{row['merged']['p99_s']:.2f}  |  "
                f"swarm/serial {row['x_vs_serial']:.1f}x  swarm/merged {row['x_vs_merged']:.1f}x",
                flush=True,
            )
            if args.json_format:
                json_row = row["swarm+json"]
                print(
                    f"      swarm+json tokens/s {json_row['tokens_per_s']:8.1f}  p50/p99 s "
                    f"{json_row['p50_s']:.2f}/{json_row['p99_s']:.2f}  swarm/(swarm+json) "
                    f"{row['x_vs_swarm+json']:.2f}x",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

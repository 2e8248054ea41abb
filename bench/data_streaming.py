"""A training set streamed from the store (``swarm_trainer.stream``) at 100 MB, 1 GB and 4 GB,
against the in-memory path every rank took before it (read the whole JSONL, tokenize all of
it, take a shard), on the 100 MB set.

Per size, generated prompt/completion JSONL (random words, lengths spread like an instruction
set) is stored as the gateway stores it (seekable zstd, ``datasets/<tenant>/<sha>.jsonl.zst``)
in a local-directory store, then 2 ranks run at once, each in its own process (so its peak
RSS is its own), each as a trainer rank does: its share of the frames, tokenized through the
token cache, micro-batches of ``--batch`` packed into rows of ``--seq-len``, training steps of
the tiny Llama of the tests with a LoRA adapter (``step.train_step``). The ranks do not
all-reduce (no process group): what is measured is each rank's data path under its own
steps. Per rank:

* peak RSS (``ru_maxrss``, with torch and the model: the same for every path);
* time to first step: from the rank's start (imports done) to its first step's end;
* tokens/s: real tokens of the steps after the first ``--untimed``, over their wall time;
* bytes read from the store (the dataset's and the token cache's), against the dataset's
  stored size;
* packing: real tokens / packed row capacity, over the steps.

Each streamed size runs twice: **cold** (the token cache empty: the ranks tokenize their
frames while they train, and fill it) and **warm** (a later job: every frame from the cache).

    .venv/bin/python bench/data_streaming.py [--sizes 100M,1G,4G] [--steps 300] [--dir DIR]

Generated data stays in ``--dir`` (default a temp dir) and is reused by a later run.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SEED = 0
WORLD = 2
WORDS = [
    *("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be"),
    *("by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but"),
    *("have", "an", "they", "you", "were", "her", "she", "there", "been", "one", "all", "we"),
    *("model", "data", "train", "token", "answer", "question", "write", "explain", "reason"),
]


def parse_size(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def make_dataset(root: Path, size: int) -> tuple[Path, dict[str, Any]]:
    """A store under ``root`` holding ``size`` bytes of JSONL, stored as the gateway does;
    (store root, DatasetInfo as JSON). Made once, reused."""
    from swarm_contracts.datasets import DatasetInfo, dataset_id_for
    from swarm_contracts.layout import dataset_key
    from swarm_runtime.dataset_codec import zstd_writer

    store_root = root / f"store-{size}"
    info_path = root / f"dataset-{size}.json"
    if info_path.exists():
        return store_root, json.loads(info_path.read_text())
    rnd = random.Random(SEED)
    pool = []
    for _ in range(20_000):
        # Log-normal lengths: most examples short, a long tail (as in real instruction sets).
        prompt = " ".join(rnd.choices(WORDS, k=min(400, int(rnd.lognormvariate(3.3, 0.7)))))
        answer = " ".join(rnd.choices(WORDS, k=min(300, int(rnd.lognormvariate(3.0, 0.8)))))
        pool.append((prompt, answer))
    tmp = root / f"tmp-{size}.zst"
    digest = hashlib.sha256()
    written = examples = 0
    with open(tmp, "wb") as out, zstd_writer(out) as packed:
        while written < size:
            prompt, answer = pool[examples % len(pool)]
            line = (
                json.dumps({"prompt": f"#{examples} {prompt}", "completion": f" {answer}"}) + "\n"
            ).encode()
            digest.update(line)
            packed.write(line)
            written += len(line)
            examples += 1
    sha = digest.hexdigest()
    key = dataset_key("bench", sha)
    target = store_root / key
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)
    info = DatasetInfo(
        id=dataset_id_for(sha),
        tenant="bench",
        sha256=sha,
        store_key=key,
        format="prompt_completion",
        examples=examples,
        bytes=written,
    )
    info_path.write_text(info.model_dump_json())
    return store_root, json.loads(info.model_dump_json())


@dataclass
class RankResult:
    path: str
    size: int
    rank: int
    peak_rss_mb: float
    first_step_s: float
    tokens_per_s: float
    bytes_read: int
    stored_bytes: int
    jsonl_bytes: int
    packing: float
    cache_hits: int


def run_rank(args: dict[str, Any], rank: int, out: Any) -> None:
    """One rank, in its own process: set up as ``recipe.load_data`` does, then train."""
    import torch

    from swarm_contracts.datasets import DatasetInfo
    from swarm_runtime.dataset_frames import open_frames
    from swarm_runtime.store import LocalStore
    from swarm_trainer.data import BatchSampler, encode_example, read_jsonl, shard, tokenize
    from swarm_trainer.step import make_optimizer, train_step
    from swarm_trainer.stream import FrameSource, Holdout, Share, TrainStream
    from swarm_trainer.token_cache import TokenCache, tokenizer_digest

    torch.set_num_threads(1)
    started = time.monotonic()
    model_dir = Path(args["model_dir"])
    model, tokenizer = load_model(model_dir)
    info = DatasetInfo.model_validate(args["info"])
    store = LocalStore(Path(args["store"]))
    seq_len, batch = args["seq_len"], args["batch"]
    bytes_read: Any
    if args["path"] == "in-memory":
        local = Path(args["work"]) / f"r{rank}.jsonl"
        from swarm_runtime.dataset_codec import fetch_jsonl

        fetch_jsonl(store, info.store_key, local)
        records = read_jsonl(local)
        mine = shard(range(len(records)), rank, WORLD)
        examples = tokenize([records[i] for i in mine], tokenizer, seq_len, mine)
        del records
        sampler: Any = BatchSampler(examples, batch, 0, SEED + rank, pack_to=seq_len)

        def bytes_read() -> int:
            return store.size(info.store_key)

        hits = lambda: 0  # noqa: E731
    else:
        cache = TokenCache.of(
            store,
            info,
            tokenizer_digest(model_dir),
            seq_len,
            "sft1",
            Path(args["work"]) / f"tokens-r{rank}",
            writable=True,
        )

        def raw() -> Any:
            frames = open_frames(store, info.store_key)
            assert frames is not None
            return frames

        encode = functools.partial(encode_example, tokenizer=tokenizer, seq_len=seq_len)
        source = FrameSource(cache, encode, raw)
        share = Share.of(source.count, rank, WORLD)
        holdout = Holdout(val_fraction=0.0, eval_fraction=None, seed=SEED)
        sampler = TrainStream(source, share, holdout, batch, 0, SEED + rank, pack_to=seq_len)

        def bytes_read() -> int:
            return source.bytes_read

        def hits() -> int:
            return cache.hits

    cpu = torch.device("cpu")
    optimizer = make_optimizer((p for p in model.parameters() if p.requires_grad), 1e-4, cpu)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    first_step = 0.0
    timed_tokens, timed_from = 0, 0.0
    real = capacity = 0
    for step in range(args["steps"]):
        b = sampler.batch(step)
        real += b.tokens
        capacity += b.inputs["input_ids"].numel()
        result = train_step(model, [b], optimizer, scheduler, 1.0, cpu, False)
        if step == 0:
            first_step = time.monotonic() - started
        if step == args["untimed"] - 1:
            timed_from = time.monotonic()
        elif step >= args["untimed"]:
            timed_tokens += result.tokens
    elapsed = time.monotonic() - timed_from
    if hasattr(sampler, "close"):
        sampler.close()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.put(
        RankResult(
            path=args["path"],
            size=args["size"],
            rank=rank,
            peak_rss_mb=peak_kb / 1024,
            first_step_s=first_step,
            tokens_per_s=timed_tokens / max(elapsed, 1e-9),
            bytes_read=bytes_read(),
            stored_bytes=store.size(info.store_key),
            jsonl_bytes=info.bytes,
            packing=real / max(capacity, 1),
            cache_hits=hits(),
        )
    )


def load_model(model_dir: Path) -> tuple[Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    model.train()
    return model, AutoTokenizer.from_pretrained(model_dir)


def run(args: dict[str, Any]) -> list[RankResult]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(args, r, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a rank failed with exit code {p.exitcode}")
    return sorted(results, key=lambda r: r.rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100M,1G,4G")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--untimed", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--no-baseline", action="store_true", help="skip the in-memory path")
    opts = parser.parse_args()
    root = opts.dir or Path(tempfile.mkdtemp(prefix="swarm-bench-data-"))
    root.mkdir(parents=True, exist_ok=True)
    from swarm_trainer.tiny_model import create_tiny_model

    model_dir = root / "tiny-model"
    if not (model_dir / "config.json").exists():
        create_tiny_model(model_dir)
    sizes = [parse_size(s) for s in opts.sizes.split(",")]
    rows: list[RankResult] = []
    for i, size in enumerate(sizes):
        t = time.monotonic()
        store_root, info = make_dataset(root, size)
        print(f"dataset {size / 1e6:.0f} MB ready ({time.monotonic() - t:.0f} s)", file=sys.stderr)
        shutil.rmtree(store_root / "tokens", ignore_errors=True)  # a cold token cache
        paths = ["streamed-cold", "streamed-warm"]
        if i == 0 and not opts.no_baseline:
            paths = ["in-memory", *paths]
        for path in paths:
            work = Path(tempfile.mkdtemp(prefix="swarm-bench-work-", dir=root))
            args = {
                "path": path,
                "size": size,
                "store": str(store_root),
                "info": info,
                "model_dir": str(model_dir),
                "work": str(work),
                "steps": opts.steps,
                "untimed": opts.untimed,
                "batch": opts.batch,
                "seq_len": opts.seq_len,
            }
            results = run(args)
            shutil.rmtree(work, ignore_errors=True)
            rows += results
            for r in results:
                print(json.dumps(asdict(r)), file=sys.stderr)
    print_table(rows)


def print_table(rows: list[RankResult]) -> None:
    print(
        "| path | dataset | peak RSS per rank (MB) | time to first step (s) | tokens/s per rank "
        "| bytes read per rank / stored (zstd) | / JSONL | packing |"
    )
    print("|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, int], list[RankResult]] = {}
    for r in rows:
        groups.setdefault((r.path, r.size), []).append(r)
    for (path, size), ranks in groups.items():
        rss = " / ".join(f"{r.peak_rss_mb:.0f}" for r in ranks)
        first = " / ".join(f"{r.first_step_s:.1f}" for r in ranks)
        tps = " / ".join(f"{r.tokens_per_s:.0f}" for r in ranks)
        read = " / ".join(f"{r.bytes_read / r.stored_bytes:.3f}" for r in ranks)
        jsonl = " / ".join(f"{r.bytes_read / r.jsonl_bytes:.3f}" for r in ranks)
        packing = statistics.mean(r.packing for r in ranks)
        label = f"{size / 1e9:.1f} GB" if size >= 10**9 else f"{size / 1e6:.0f} MB"
        print(f"| {path} | {label} | {rss} | {first} | {tps} | {read} | {jsonl} | {packing:.3f} |")


if __name__ == "__main__":
    main()

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
* time to first step: from the rank's start (imports done) to its first step's end, and of
  that the data's part: from setting the data up to the first micro-batch;
* tokens/s: real tokens of the steps after the first ``--untimed``, over their wall time;
* bytes read from the store (the dataset's and the token cache's) over the run, against the
  dataset's stored size; with ``--epoch``, also over a whole epoch (after the timed steps the
  rank reads on to the end of its first epoch, without training), and the share of the
  stored bytes its frames are;
* packing: real tokens / packed row capacity, over the steps.

Each streamed size runs twice: **cold** (the token cache empty: the ranks tokenize their
frames while they train, and fill it) and **warm** (a later job: every frame from the cache);
``--repeats N`` runs the pair N times, and the table gives each rank's medians.
The in-memory path runs last, on the first size only: it loads as before, then trains in
rounds alternating ``--round`` steps from its in-memory batches and as many from the (warm)
stream, in the same process and under the same load, which is what its tokens/s ratio is of
(the first round not counted).

    .venv/bin/python bench/data_streaming.py [--sizes 100M,1G,4G] [--steps 300] [--epoch]
        [--repeats 3] [--dir DIR]

Generated data stays in ``--dir`` (default a temp dir) and is reused by a later run.
"""

from __future__ import annotations

import argparse
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
    stored_bytes: int
    jsonl_bytes: int = 0
    peak_rss_mb: float = 0.0
    first_step_s: float = 0.0  # from the rank's start (the model's load included)
    first_batch_s: float = 0.0  # from the data's set-up to the first micro-batch
    tokens_per_s: float = 0.0
    bytes_read: int = 0  # from the store, over the timed steps
    packing: float = 0.0
    cache_hits: int = 0
    share: float = 1.0  # of the stored bytes: the rank's frames (1: the in-memory path)
    epoch_bytes_read: int | None = None  # to the end of the first epoch (``--epoch``)
    stream_tokens_per_s: float | None = None  # interleaved with the in-memory path


class Rank:
    """One rank, in its own process: its data set up as ``recipe.load_data`` does (or as every
    rank did before streaming), the tiny model, an optimizer."""

    def __init__(self, args: dict[str, Any], rank: int) -> None:
        import torch

        from swarm_contracts.datasets import DatasetInfo
        from swarm_runtime.store import LocalStore
        from swarm_trainer.step import make_optimizer

        torch.set_num_threads(1)
        self.started = time.monotonic()
        self.args, self.rank = args, rank
        self.cpu = torch.device("cpu")
        self.model_dir = Path(args["model_dir"])
        self.model, self.tokenizer = load_model(self.model_dir)
        self.info = DatasetInfo.model_validate(args["info"])
        self.store = LocalStore(Path(args["store"]))
        self.stored = self.store.size(self.info.store_key)
        params = (p for p in self.model.parameters() if p.requires_grad)
        self.optimizer = make_optimizer(params, 1e-4, self.cpu)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    def in_memory(self) -> Any:
        """The whole dataset read, parsed and this rank's shard tokenized, as before."""
        from swarm_runtime.dataset_codec import fetch_jsonl
        from swarm_trainer.data import BatchSampler, read_jsonl, shard
        from swarm_trainer.methods.sft import tokenize

        local = Path(self.args["work"]) / f"r{self.rank}.jsonl"
        fetch_jsonl(self.store, self.info.store_key, local)
        records = read_jsonl(local)
        mine = shard(range(len(records)), self.rank, WORLD)
        examples = tokenize([records[i] for i in mine], self.tokenizer, self.args["seq_len"], mine)
        del records
        return BatchSampler(examples, self.args["batch"], 0, SEED + self.rank, self.args["seq_len"])

    def streamed(self) -> Any:
        """This rank's share, streamed through the token cache."""
        from swarm_runtime.dataset_frames import open_frames
        from swarm_trainer.methods import Sft
        from swarm_trainer.stream import FrameSource, Holdout, Share, TrainStream
        from swarm_trainer.token_cache import TokenCache, tokenizer_digest

        seq_len = self.args["seq_len"]
        cache = TokenCache.of(
            self.store,
            self.info,
            tokenizer_digest(self.model_dir),
            seq_len,
            Sft.encoding,
            Path(self.args["work"]) / f"tokens-r{self.rank}",
            writable=True,
        )

        def raw() -> Any:
            return open_frames(self.store, self.info.store_key)

        source = FrameSource(cache, Sft(), self.tokenizer, seq_len, raw)
        share = Share.of(source.count, self.rank, WORLD)
        holdout = Holdout(val_fraction=0.0, eval_fraction=None, seed=SEED)
        batch = self.args["batch"]
        return TrainStream(source, share, holdout, batch, 0, SEED + self.rank, pack_to=seq_len)

    def step(self, batch: Any) -> int:
        from swarm_trainer.step import train_step

        out = train_step(self.model, [batch], self.optimizer, self.scheduler, 1.0, self.cpu)
        return int(out.tokens)

    def steps(self, sampler: Any, result: RankResult) -> None:
        """The timed run: time to first step, tokens/s after ``untimed``, packing."""
        timed_tokens, timed_from = 0, 0.0
        real = capacity = 0
        for step in range(self.args["steps"]):
            b = sampler.batch(step)
            if step == 0:
                result.first_batch_s = time.monotonic() - self.data_started
            real += b.tokens
            capacity += b.inputs["input_ids"].numel()
            tokens = self.step(b)
            if step == 0:
                result.first_step_s = time.monotonic() - self.started
            if step == self.args["untimed"] - 1:
                timed_from = time.monotonic()
            elif step >= self.args["untimed"]:
                timed_tokens += tokens
        result.tokens_per_s = timed_tokens / max(time.monotonic() - timed_from, 1e-9)
        result.packing = real / max(capacity, 1)

    def interleaved(self, sampler: Any, result: RankResult) -> None:
        """Rounds of in-memory and streamed (warm) steps in turn, the first round uncounted:
        the two paths' tokens/s under the same load."""
        stream = self.streamed()
        paths = {"memory": sampler, "stream": stream}
        index = {"memory": self.args["steps"], "stream": 0}
        totals = {"memory": [0.0, 0.0], "stream": [0.0, 0.0]}
        for round_ in range(self.args["rounds"] + 1):
            for name, source in paths.items():
                began, tokens = time.monotonic(), 0
                for _ in range(self.args["round"]):
                    tokens += self.step(source.batch(index[name]))
                    index[name] += 1
                if round_ > 0:
                    totals[name][0] += tokens
                    totals[name][1] += time.monotonic() - began
        stream.close()
        result.tokens_per_s = totals["memory"][0] / totals["memory"][1]
        result.stream_tokens_per_s = totals["stream"][0] / totals["stream"][1]

    def run(self) -> RankResult:
        from swarm_runtime.dataset_frames import ZstdFrames, open_frames

        path = self.args["path"]
        result = RankResult(path, self.args["size"], self.rank, stored_bytes=self.stored)
        result.jsonl_bytes = self.info.bytes
        self.data_started = time.monotonic()
        if path == "in-memory":
            sampler = self.in_memory()
            self.steps(sampler, result)
            result.bytes_read = self.stored  # the whole object, on every rank
            self.interleaved(sampler, result)
        else:
            stream = self.streamed()
            frames = open_frames(self.store, self.info.store_key)
            assert isinstance(frames, ZstdFrames)
            mine = sum(frames.frames[i].size for i in stream.share.frames)
            result.share = mine / self.stored
            self.steps(stream, result)
            result.bytes_read = stream.source.bytes_read
            result.cache_hits = stream.source.cache.hits
            if self.args["epoch"]:
                # On to the end of the first epoch, without training: what a whole epoch reads.
                index = self.args["steps"]
                while stream.position(index).epoch == 0:
                    stream.batch(index)
                    index += 1
                result.epoch_bytes_read = stream.source.bytes_read
            stream.close()
        result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return result


def run_rank(args: dict[str, Any], rank: int, out: Any) -> None:
    out.put(Rank(args, rank).run())


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
    parser.add_argument(
        "--epoch", action="store_true", help="the first size's first runs read a whole epoch"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each streamed path")
    parser.add_argument("--rounds", type=int, default=6, help="in-memory vs stream rounds")
    parser.add_argument("--round", type=int, default=20, help="steps per path and round")
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
        paths = ["streamed-cold", "streamed-warm"] * opts.repeats
        if i == 0 and not opts.no_baseline:
            paths.append("in-memory")
        for n, path in enumerate(paths):
            if path == "streamed-cold":
                shutil.rmtree(store_root / "tokens", ignore_errors=True)  # a cold token cache
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
                "epoch": opts.epoch and i == 0 and n < 2,
                "rounds": opts.rounds,
                "round": opts.round,
            }
            results = run(args)
            shutil.rmtree(work, ignore_errors=True)
            rows += results
            for r in results:
                print(json.dumps(asdict(r)), file=sys.stderr)
    print_table(rows)


def print_table(rows: list[RankResult]) -> None:
    """Per rank, the median over a path's repeats."""
    print(
        "| path | dataset | runs | peak RSS per rank (MB) | time to first step (s) | of which "
        "data (s) | tokens/s per rank | bytes read per rank / stored: the run | an epoch "
        "| its frames | packing |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, int], list[RankResult]] = {}
    for r in rows:
        groups.setdefault((r.path, r.size), []).append(r)
    for (path, size), runs in groups.items():

        def each(value: Any, fmt: str, runs: list[RankResult] = runs) -> str:
            found = []
            for rank in range(WORLD):
                values = [value(r) for r in runs if r.rank == rank and value(r) is not None]
                found.append(format(statistics.median(values), fmt) if values else "-")
            return " / ".join(found)

        label = f"{size / 1e9:.0f} GB" if size >= 10**9 else f"{size / 1e6:.0f} MB"
        epoch = each(
            lambda r: None if r.epoch_bytes_read is None else r.epoch_bytes_read / r.stored_bytes,
            ".3f",
        )
        cells = [
            path,
            label,
            str(len(runs) // WORLD),
            each(lambda r: r.peak_rss_mb, ".0f"),
            each(lambda r: r.first_step_s, ".1f"),
            each(lambda r: r.first_batch_s, ".2f"),
            each(lambda r: r.tokens_per_s, ".0f"),
            each(lambda r: r.bytes_read / r.stored_bytes, ".3f"),
            epoch,
            each(lambda r: r.share, ".3f"),
            f"{statistics.mean(r.packing for r in runs):.3f}",
        ]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.stream_tokens_per_s is not None:
            ratio = r.stream_tokens_per_s / r.tokens_per_s
            print(
                f"\nrank {r.rank}, interleaved in one process: in-memory {r.tokens_per_s:.0f} "
                f"tokens/s, streamed (warm) {r.stream_tokens_per_s:.0f} tokens/s: {ratio:.3f}"
            )


if __name__ == "__main__":
    main()

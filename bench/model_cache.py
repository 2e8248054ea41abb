"""Cached transfers: time from assignment to the first training step, a job on a base model the
worker has never seen (cold) vs the next job on the same model (warm, from the worker's cache).

A random Llama of a few hundred MB (fp32 safetensors, made here: no network) is put in a store
(an S3 server, moto's, on this machine by default; ``--store file`` for a local directory). Each
round runs two one-attempt jobs through ``run_job`` (what the agent runs on an assignment: Ray
Train workers, then the base model and data through the cache, then the steps) on a fresh cache:
cold, then warm. Rounds repeat, so the sides interleave (cold, warm, cold, warm, ...); the ratio
is the median of the per-round ratios, since machines are noisy.

A store on the same machine is no provider's store: ``--link-mbit`` puts the S3 server behind a
TCP proxy that passes at most that many Mbit/s towards the worker (one link shared by all
connections; 0: no proxy), and each link speed given is measured in turn.

Printed per side: seconds from the call to rank 0's first optimizer step (``Progress`` report),
and of those the fetch (``Started.fetch_s``: downloading and hashing the model and data on a
miss, hashing the cached copies on a hit).

    .venv/bin/python bench/model_cache.py [--mb 300] [--repeats 3] [--link-mbit 0 200]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import socket
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch

from swarm_contracts.datasets import DatasetInfo, dataset_id_for
from swarm_contracts.jobs import JobSpec, ModelRef
from swarm_contracts.layout import dataset_key
from swarm_contracts.workers import Assignment
from swarm_runtime.store import ObjectStore, open_store, tree_digest
from swarm_trainer import reports
from swarm_trainer.run import run_job
from swarm_trainer.settings import TrainerSettings
from swarm_trainer.tiny_model import build_tokenizer

MODEL_KEY = "models/bench-llama/0000000000000000"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model(out: Path, mb: int) -> int:
    """A random Llama with hidden 1024 and as many layers as make about ``mb`` MB in fp32;
    return its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    hidden, inter = 1024, 2816
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = max(1, round(mb * 1e6 / 4 / per_layer))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def put_data(store: ObjectStore) -> DatasetInfo:
    records = [
        {"prompt": f"Question: what is {i} plus {i}? Answer:", "completion": f" {2 * i}."}
        for i in range(64)
    ]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    sha = hashlib.sha256(data).hexdigest()
    key = dataset_key("default", sha)
    store.put_bytes(key, data)
    return DatasetInfo(
        id=dataset_id_for(sha),
        tenant="default",
        sha256=sha,
        store_key=key,
        format="prompt_completion",
        examples=len(records),
        bytes=len(data),
    )


def assignment(job_id: str, model: ModelRef, data: DatasetInfo) -> Assignment:
    spec = JobSpec.model_validate(
        {
            "name": "bench",
            "base_model": model.name,
            "dataset": data.id,
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "training": {
                "max_steps": 1,
                "batch_size": 4,
                "seq_len": 64,
                "eval_every": 1,
                "checkpoint_every": 1,
                "val_fraction": 0.1,
            },
            "resources": {"workers": 1, "cpus_per_worker": 1},
        }
    )
    return Assignment(
        job_id=job_id,
        attempt=1,
        tenant="default",
        worker_id="bench",
        spec=spec,
        base_model=model,
        dataset=data,
    )


class Link:
    """A TCP proxy to ``upstream`` that passes at most ``mbit`` Mbit/s towards the client, all
    connections together (one link): the worker's side of a store on the internet."""

    def __init__(self, upstream: int, mbit: float) -> None:
        self.upstream = upstream
        self.bytes_per_s = mbit * 1e6 / 8
        self.lock = threading.Lock()
        self.free_at = 0.0  # when the link has sent everything it was given so far
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(64 * 1024):
                if throttled:
                    with self.lock:
                        now = time.monotonic()
                        self.free_at = max(now, self.free_at) + len(chunk) / self.bytes_per_s
                        wait = self.free_at - now
                    time.sleep(wait)
                dst.sendall(chunk)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


@contextlib.contextmanager
def s3_server() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield port
    finally:
        server.stop()


def s3_settings(port: int) -> TrainerSettings:
    return TrainerSettings(
        store_url=f"s3://bench?endpoint=http://127.0.0.1:{port}",
        s3_access_key="testing",
        s3_secret_key="testing-secret",
    )


def timed_run(
    job: Assignment, settings: TrainerSettings, store: ObjectStore
) -> tuple[float, float, str]:
    """(seconds to the first step, seconds of fetching, what came from the cache)."""
    from swarm_trainer.control import drain, make_control

    control = make_control()
    began = time.time()
    # No Ray retries: a crashed rank would resume past the only step and time nothing.
    run_job(job, settings, store, control=control, max_failures=0)
    sent = drain(control, 0.0)
    started = next((m for m in sent if isinstance(m, reports.Started)), None)
    first = next((m for m in sent if isinstance(m, reports.Progress)), None)
    if started is None or first is None:
        raise RuntimeError(f"{job.job_id} reported {[type(m).__name__ for m in sent]}")
    return first.at - began, started.fetch_s, ",".join(started.cached) or "-"


def rounds(
    label: str,
    settings: TrainerSettings,
    root: Path,
    model: ModelRef,
    data: DatasetInfo,
    repeats: int,
) -> str:
    """Cold and warm jobs, interleaved; the table row of their medians."""
    store = open_store(settings)
    rows: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    ratios, fetch_ratios = [], []
    for r in range(repeats):
        # A fresh cache per round: the first job misses, the second hits.
        work = root / f"work-{label}-{r}"
        for side in ("cold", "warm"):
            # Ids unique in the store: a job id seen before would resume from its checkpoint.
            job = assignment(f"job-bench-{uuid.uuid4().hex[:12]}-{side}", model, data)
            first_step, fetch_s, cached = timed_run(
                job, settings.model_copy(update={"work_dir": work}), store
            )
            rows[side].append((first_step, fetch_s))
            print(
                f"{label} round {r + 1} {side}: first step after {first_step:6.2f} s, "
                f"fetch {fetch_s:6.2f} s (cached: {cached})",
                flush=True,
            )
        (cold, cold_fetch), (warm, warm_fetch) = rows["cold"][-1], rows["warm"][-1]
        ratios.append(warm / cold)
        fetch_ratios.append(warm_fetch / cold_fetch)

    def med(side: str, i: int) -> float:
        return statistics.median(row[i] for row in rows[side])

    return (
        f"| {label} | {med('cold', 0):.2f} ({med('cold', 1):.2f}) | "
        f"{med('warm', 0):.2f} ({med('warm', 1):.2f}) | {statistics.median(ratios):.2f} | "
        f"{statistics.median(fetch_ratios):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="model size in MB (fp32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", choices=["s3", "file"], default="s3")
    parser.add_argument(
        "--link-mbit",
        type=float,
        nargs="+",
        default=[0, 200],
        help="the worker's link to the S3 store, Mbit/s (0: unlimited); each is measured",
    )
    args = parser.parse_args()

    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="swarm-bench-")))
        if args.store == "file":
            targets = [("local directory", TrainerSettings(store_url=(root / "store").as_uri()))]
        else:
            port = stack.enter_context(s3_server())
            targets = []
            for mbit in args.link_mbit:
                if mbit <= 0:
                    targets.append(("S3, same machine", s3_settings(port)))
                else:
                    link = Link(port, mbit)
                    stack.callback(link.close)
                    targets.append((f"S3 over {mbit:g} Mbit/s", s3_settings(link.port)))
        store = open_store(targets[0][1])
        params = make_model(root / "model", args.mb)
        files = store.upload_dir(root / "model", MODEL_KEY)
        size = sum(p.stat().st_size for p in (root / "model").iterdir())
        model = ModelRef(
            name="bench-llama", version=1, store_key=MODEL_KEY, digest=tree_digest(files)
        )
        data = put_data(store)
        print(
            f"model: {params / 1e6:.0f}M parameters, {size / 1e6:.0f} MB in {len(files)} files; "
            f"torch {torch.__version__}; {os.cpu_count()} CPUs",
            flush=True,
        )
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        stack.callback(ray.shutdown)
        results = [
            rounds(label, settings, root, model, data, args.repeats) for label, settings in targets
        ]

    print()
    print(
        f"median of {args.repeats} interleaved rounds; seconds from the assignment to the first "
        "step (of which fetching the model and data):"
    )
    print()
    print("| store | first job, cold cache | second job, warm cache | warm / cold | fetch w / c |")
    print("|---|---|---|---|---|")
    for row in results:
        print(row)


if __name__ == "__main__":
    main()
